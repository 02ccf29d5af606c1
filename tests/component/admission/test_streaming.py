"""Streams through the sidecar: unbuffered, released on every path, usage handled."""

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from tidegate.admission.ticket import TicketState

from .helpers import chat, eventually, fake_upstream, sse_events


async def test_client_abort_mid_stream_releases_and_the_next_request_is_admitted(
    start_sim, start_sidecar, http
) -> None:
    sim = await start_sim(decode_tokens_per_s=20)
    sidecar = await start_sidecar(sim.url, admission={"maxConcurrency": 1, "queue": {"maxDepth": 0}})
    resp = await http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=500, stream=True))
    assert resp.status == 200
    assert len(await sse_events(resp, limit=3)) == 3
    assert sidecar.engine.in_flight_requests == 1
    resp.close()  # the client goes away mid-stream
    await eventually(lambda: sidecar.engine.in_flight_requests == 0, what="in-flight back to zero")
    assert sidecar.engine.in_flight_tokens == 0
    await eventually(lambda: sim.model.num_running == 0, what="the backend aborted the generation")
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as ok:
        assert ok.status == 200


async def _paced_upstream(request: web.Request) -> web.StreamResponse:
    """An SSE upstream sending one event every 50 ms, each stamped with its send time."""
    body = await request.json()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(body.get("max_tokens", 40)):
        event = {"choices": [{"index": 0, "delta": {"content": f" t{i}"}}], "sent": time.monotonic()}
        await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await asyncio.sleep(0.05)
    await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture
async def paced_upstream() -> AsyncIterator[str]:
    async with fake_upstream({"/v1/chat/completions": _paced_upstream}) as url:
        yield url


@pytest.mark.timing  # 10 ms gap bound: 13 ms p95 once beside the cluster tier's workers
async def test_sse_gaps_are_preserved(paced_upstream, start_sidecar, http) -> None:
    sidecar = await start_sidecar(paced_upstream, model={"engine": "openai"})
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=40, stream=True)) as resp:
        assert resp.headers["X-Accel-Buffering"] == "no"
        assert resp.headers["Cache-Control"] == "no-cache"
        events = [(t, e) for t, e in await sse_events(resp) if isinstance(e, dict)]
    assert len(events) == 40  # one client event per upstream event: nothing coalesced
    sent = [e["sent"] for _, e in events]
    arrived = [t for t, _ in events]
    upstream_gaps = [b - a for a, b in itertools.pairwise(sent)]
    client_gaps = [b - a for a, b in itertools.pairwise(arrived)]
    errors_ms = sorted(abs(c - u) * 1000 for c, u in zip(client_gaps, upstream_gaps, strict=True))
    p95 = errors_ms[int(0.95 * (len(errors_ms) - 1))]
    assert p95 <= 10.0, f"gap error p95 {p95:.1f} ms (median client gap {statistics.median(client_gaps) * 1000:.1f} ms)"
    assert abs(statistics.median(client_gaps) - 0.050) < 0.010


async def test_usage_chunk_is_hidden_unless_asked_and_charged(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url)
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=5, stream=True)) as resp:
        events = await sse_events(resp)
    assert events[-1][1] == "[DONE]"
    assert not any(isinstance(e, dict) and e.get("usage") for _, e in events)
    assert sidecar.engine.counters.usage_missing_total == 0  # we asked upstream on the client's behalf
    charged = sidecar.engine.counters.charged_tokens_total
    body = chat(max_tokens=5, stream=True, stream_options={"include_usage": True})
    async with http.post(sidecar.url + "/v1/chat/completions", json=body) as resp:
        events = await sse_events(resp)
    usage = [e["usage"] for _, e in events if isinstance(e, dict) and e.get("usage")]
    assert len(usage) == 1
    assert sidecar.engine.counters.charged_tokens_total - charged == usage[0]["total_tokens"]


async def test_largest_output_cap_is_reserved(start_sim, start_sidecar, http) -> None:
    sim = await start_sim(decode_tokens_per_s=20)
    sidecar = await start_sidecar(sim.url)
    body = chat("hi", max_tokens=1, max_completion_tokens=10000, stream=True)
    async with http.post(sidecar.url + "/v1/chat/completions", json=body) as resp:
        await sse_events(resp, limit=1)
        (ticket,) = sidecar.engine.in_flight.values()
        assert ticket.cost.output_tokens == 10000
        async with http.get(sidecar.url + "/tidegate/stats") as stats:
            doc = await stats.json()
        assert doc["in_flight_tokens"] == ticket.reserved_tokens >= 10000
        assert doc["in_flight_tokens"] - 10000 == ticket.reserved_tokens - 10000 < 100  # the small prompt


async def test_client_gone_while_queued_is_never_dispatched(start_sim, start_sidecar, http) -> None:
    sim = await start_sim(decode_tokens_per_s=20)
    sidecar = await start_sidecar(sim.url, admission={"maxConcurrency": 1, "queue": {"maxWaitMs": 30000}})
    first = await http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=40, stream=True))
    await sse_events(first, limit=1)
    batch = {"x-priority": "batch"}  # a 60 s SLO: it waits rather than being refused as unreachable
    task = asyncio.ensure_future(
        http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=5), headers=batch)
    )
    await eventually(lambda: sidecar.engine.queue.depth == 1, what="second request queued")
    (waiting,) = list(sidecar.engine.queue.queued())
    task.cancel()  # the client gives up while queued
    await eventually(lambda: waiting.state is TicketState.CANCELLED, what="queued ticket cancelled")
    await sse_events(first)
    first.close()
    await eventually(lambda: sidecar.engine.in_flight_requests == 0)
    assert waiting.admitted_at_s is None  # never dispatched
    assert sidecar.engine.counters.admitted_total == 1


async def test_upstream_5xx_is_relayed_and_counted_as_failure(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url)
    async with http.post(sim.url + "/sim/faults", json={"error_rate": 1.0}) as r:
        assert r.status == 200
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 500
    assert sidecar.engine.in_flight_requests == 0
    assert sidecar.engine.breaker._consecutive_failures == 1


async def test_unreachable_upstream_is_a_502_and_releases(start_sidecar, http) -> None:
    sidecar = await start_sidecar("http://127.0.0.1:9")  # discard port: connection refused
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 502
        assert (await resp.json())["error"]["code"] == "upstream_error"
    assert sidecar.engine.in_flight_requests == 0


async def test_other_paths_pass_through(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url)
    async with http.get(sidecar.url + "/v1/models") as resp:
        assert resp.status == 200
        assert (await resp.json())["data"][0]["id"] == "sim-llama-3.1-8b"
    async with http.post(sidecar.url + "/tokenize", json={"model": "sim-llama-3.1-8b", "prompt": "abcd efgh"}) as resp:
        assert resp.status == 200
    assert sidecar.engine.counters.admitted_total == 0


async def test_backend_tokenizer_makes_the_prompt_exact(start_sim, start_sidecar, http) -> None:
    sim = await start_sim(decode_tokens_per_s=20)
    sidecar = await start_sidecar(sim.url, model={"tokenizer": "backend"}, admission={"safetyFactor": 2.0})
    body = chat("the quick brown fox jumps over the lazy dog " * 20, max_tokens=50, stream=True)
    async with http.post(sim.url + "/tokenize", json={"model": body["model"], "messages": body["messages"]}) as r:
        count = (await r.json())["count"]
    async with http.post(sidecar.url + "/v1/chat/completions", json=body) as resp:
        await sse_events(resp, limit=1)
        (ticket,) = sidecar.engine.in_flight.values()
    assert ticket.cost.prompt_exact and ticket.cost.prompt_tokens == count
    assert ticket.reserved_tokens == count + 50  # exact: no safety factor


def _llamacpp_chunk(index: int, text: str, finish: str | None = None, usage: dict | None = None) -> bytes:
    """One event of llama.cpp's streamed /v1/completions (tools/server/server-task.cpp, llama.cpp
    0c1e570): the final chunk of each completion carries ``usage`` next to its ``finish_reason``."""
    doc: dict = {
        "choices": [{"text": text, "index": index, "logprobs": None, "finish_reason": finish}],
        "created": 1, "model": "smollm2", "system_fingerprint": "b1-0c1e570", "object": "text_completion", "id": "c1",
    }  # fmt: skip
    if usage is not None:
        doc["usage"] = usage
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


async def _llamacpp_completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for index in range(body.get("n", 1)):
        for i in range(3):
            await resp.write(_llamacpp_chunk(index, f" w{i}"))
        usage = {"completion_tokens": 3 + index, "prompt_tokens": 7, "total_tokens": 10 + index}
        await resp.write(_llamacpp_chunk(index, "", "length", usage))
    await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture
async def llamacpp_upstream() -> AsyncIterator[str]:
    async with fake_upstream({"/v1/completions": _llamacpp_completions}) as url:
        yield url


@pytest.mark.parametrize(("n", "charged"), [(1, 10), (2, 7 + 3 + 4)])
async def test_llamacpp_usage_on_the_last_chunk_with_choices_is_charged_and_relayed(
    llamacpp_upstream, start_sidecar, http, n: int, charged: int
) -> None:
    sidecar = await start_sidecar(llamacpp_upstream, model={"engine": "llamacpp"})
    body = {"prompt": "Count:", "max_tokens": 8, "n": n, "stream": True}
    async with http.post(sidecar.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        raw = await resp.read()
    finals = [e for e in raw.split(b"\n\n") if b'"usage"' in e]
    assert len(finals) == n and all(b'"finish_reason": "length"' in e for e in finals)  # relayed, not dropped
    assert raw.count(b'"text": " w') == 3 * n and raw.endswith(b"data: [DONE]\n\n")
    assert sidecar.engine.counters.usage_missing_total == 0
    assert sidecar.engine.counters.charged_tokens_total == charged
