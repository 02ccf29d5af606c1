"""Robustness gaps from a break-it review (issue #3): each test is what a client or an operator
would notice when the model server or a client misbehaves."""

import asyncio
import contextlib
import json
import time

import pytest
from aiohttp import web

from tidegate.admission import stats
from tidegate.admission.breaker import BreakerState
from tidegate.admission.engine import EngineTuning

from .helpers import chat, error_of, eventually, sse_events


def _port(sidecar) -> int:
    return int(sidecar.url.rsplit(":", 1)[1])


async def _read_reply(reader: asyncio.StreamReader, timeout_s: float) -> tuple[int, dict, bytes]:
    """(status, lower-cased headers, body) of one HTTP/1.1 reply, read until the server closes."""
    raw = await asyncio.wait_for(reader.read(), timeout_s)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    if headers.get("transfer-encoding") == "chunked":
        decoded, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            decoded, rest = decoded + rest[:size], rest[size + 2 :]
        body = decoded
    return int(lines[0].split()[1]), headers, body


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_client_that_stops_sending_its_body_gets_408_and_holds_nothing(
    start_sim, start_sidecar, framing: str
) -> None:
    """Slow-loris: headers, a few bytes of body, then silence (or a byte now and then)."""
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url, admission={"bodyReadTimeoutSeconds": 0.5})
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(sidecar))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    started = time.monotonic()
    if framing == "content-length":
        writer.write(head + b"Content-Length: 1000\r\n\r\n" + b'{"model": "m", ')
        await writer.drain()
        status, headers, body = await _read_reply(reader, timeout_s=5.0)
    else:  # a byte every 100 ms: never idle, never done
        writer.write(head + b"Transfer-Encoding: chunked\r\n\r\n")

        async def trickle() -> None:
            while True:
                writer.write(b"1\r\n \r\n")
                await writer.drain()
                await asyncio.sleep(0.1)

        trickler = asyncio.ensure_future(trickle())
        try:
            status, headers, body = await _read_reply(reader, timeout_s=5.0)
        finally:
            trickler.cancel()
    elapsed = time.monotonic() - started
    writer.close()
    assert status == 408
    assert 0.4 <= elapsed < 3.0
    assert headers.get("connection") == "close"
    err = error_of(json.loads(body))
    assert err["code"] == "body_read_timeout" and err["type"] == "invalid_request_error"
    engine = sidecar.engine
    assert engine.in_flight_requests == engine.in_flight_tokens == engine.queue.depth == 0
    assert all(s.accepted == 0 for s in engine.tenants.states.values())
    assert engine.counters.admitted_total == 0
    assert dict(engine.counters.rejected_total) == {"bad_request": 1}  # a policy refusal: never buys GPUs
    assert sim.model.num_running == 0


async def _upstream(routes: dict[str, object]) -> tuple[web.AppRunner, str]:
    """A tiny model server over loopback: ``{"POST /v1/chat/completions": handler, "GET /metrics": ...}``."""
    app = web.Application()
    for key, handler in routes.items():
        method, path = key.split(" ", 1)
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.mark.parametrize(
    ("status", "content_type", "body", "message"),
    [
        (502, "text/html", b"<html><body><h1>502 Bad Gateway</h1></body></html>", "<html><body><h1>502 Bad Gateway</h1></body></html>"),
        (500, "text/plain", b"CUDA error: an illegal memory access was encountered\n", "CUDA error: an illegal memory access was encountered"),
        (503, "text/html", b"<p>" + b"x" * 5000 + b"</p>", "the model server answered HTTP 503 (5007 bytes of text/html, not shown)"),
        (500, "application/json", b'{"object": "error", "message": "engine dead", "type": "InternalServerError", "code": 500}', "engine dead"),
        (500, "application/json", b'{"error": "Input validation error", "error_type": "validation"}', "Input validation error"),
        (500, "application/json", b'{"detail": "Internal Server Error"}', "Internal Server Error"),
        (500, "application/json", b"", "the model server answered HTTP 500 with an empty body"),
    ],
    ids=["html-502", "plain-500", "long-html-503", "vllm-flat-json", "tgi-json", "fastapi-detail", "empty"],
)  # fmt: skip
async def test_an_upstream_5xx_in_any_shape_reaches_the_client_as_an_openai_error(
    start_sidecar, http, status: int, content_type: str, body: bytes, message: str
) -> None:
    async def fails(_request: web.Request) -> web.Response:
        return web.Response(status=status, body=body, content_type=content_type)

    runner, url = await _upstream({"POST /v1/chat/completions": fails})
    try:
        sidecar = await start_sidecar(url, model={"engine": "openai"})
        async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=2)) as resp:
            assert resp.status == status  # the status is the upstream's
            assert resp.content_type == "application/json"
            err = error_of(await resp.json())
            if status == 503:
                assert int(resp.headers["Retry-After"]) >= 1
        assert err["message"] == message
        assert err["code"] == "upstream_error"
        assert err["type"] == ("service_unavailable_error" if status == 503 else "api_error")
        # still a breaker failure, unless the body blames the request (TGI's validation error_type)
        assert sidecar.engine.breaker._consecutive_failures == (0 if b'"validation"' in body else 1)
        assert sidecar.engine.in_flight_requests == 0
    finally:
        await runner.cleanup()


async def test_an_upstream_5xx_already_in_the_openai_shape_is_relayed_unchanged(start_sidecar, http) -> None:
    doc = {"error": {"message": "out of memory", "type": "InternalServerError", "param": None, "code": 500}}

    async def fails(_request: web.Request) -> web.Response:
        return web.json_response(doc, status=500)

    runner, url = await _upstream({"POST /v1/chat/completions": fails})
    try:
        sidecar = await start_sidecar(url, model={"engine": "openai"})
        async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=2)) as resp:
            assert resp.status == 500 and await resp.json() == doc
        assert sidecar.engine.breaker._consecutive_failures == 1
    finally:
        await runner.cleanup()


def _chunk(content: str, finish: str | None = None) -> bytes:
    doc = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


@pytest.mark.parametrize("finished", [False, True], ids=["cut-short", "finish-reason-without-done"])
async def test_a_stream_closed_cleanly_without_done_is_not_passed_off_as_complete(
    start_sidecar, http, finished: bool
) -> None:
    """The upstream ends the HTTP response properly but the answer is not over (no ``[DONE]`` and no
    ``finish_reason``): the client gets an error event, and the breaker a failure. Engines that end
    with a ``finish_reason`` but no ``[DONE]`` (TGI before 2.2) are complete."""

    async def closes(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(3):
            await resp.write(_chunk(f"t{i}"))
        if finished:
            await resp.write(_chunk("", finish="stop"))
        await resp.write_eof()  # a clean end of the HTTP response, without data: [DONE]
        return resp

    runner, url = await _upstream({"POST /v1/chat/completions": closes})
    try:
        sidecar = await start_sidecar(url, model={"engine": "openai"})
        async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=20, stream=True)) as resp:
            assert resp.status == 200
            events = await sse_events(resp)
        last = events[-1][1]
        if finished:
            assert last["choices"][0]["finish_reason"] == "stop"
            assert sidecar.engine.breaker._consecutive_failures == 0
        else:
            err = error_of(last)
            assert err["code"] == "upstream_error" and "[DONE]" in err["message"]
            assert sidecar.engine.breaker._consecutive_failures == 1
            assert [e["choices"][0]["delta"]["content"] for _, e in events[:-1]] == ["t0", "t1", "t2"]
        stats = sidecar.snapshot()
        assert (stats.in_flight_requests, stats.in_flight_tokens) == (0, 0)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("message", "failures"),
    [("got exception: Unexpected empty grammar stack after accepting piece: - (29)", 0),
     ("got exception: std::bad_alloc", 1)],
    ids=["the-requests-grammar", "the-replicas-fault"],
)  # fmt: skip
async def test_an_error_event_mid_stream_is_judged_like_an_error_answer(
    start_sidecar, http, message: str, failures: int
) -> None:
    """llama.cpp reports an error raised after the first token as an SSE error event in the 200
    stream, then ends it (measured: a lazy ``grammar`` with an empty trigger pattern). One the
    request caused must not count against the replica, or one tenant opens the breaker for all."""
    error = {"error": {"code": 500, "message": message, "type": "server_error"}}

    async def breaks(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_chunk("t0"))
        await resp.write(b"data: " + json.dumps(error, separators=(",", ":")).encode() + b"\n\n")
        await resp.write_eof()
        return resp

    runner, url = await _upstream({"POST /v1/chat/completions": breaks})
    try:
        sidecar = await start_sidecar(url, model={"engine": "llamacpp"})
        async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=20, stream=True)) as resp:
            assert resp.status == 200
            events = await sse_events(resp)
        assert events[1][1] == error  # relayed as is
        assert sidecar.engine.breaker._consecutive_failures == failures
        stats = sidecar.snapshot()
        assert (stats.in_flight_requests, stats.in_flight_tokens) == (0, 0)
    finally:
        await runner.cleanup()


async def test_sse_events_without_a_space_after_data_are_progress_not_a_stall(start_sidecar, http) -> None:
    """``data:{...}`` is as valid SSE as ``data: {...}`` (the space is optional). A steady stream in
    that spelling shows progress (no stall trip), a first token, and its ``finish_reason`` ends it."""

    async def compact(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(6):
            await resp.write(_chunk(f"t{i}").replace(b"data: ", b"data:"))
            await asyncio.sleep(0.5)
        await resp.write(_chunk("", finish="stop").replace(b"data: ", b"data:"))  # and no [DONE]
        return resp

    runner, url = await _upstream({"POST /v1/chat/completions": compact})
    try:  # a 4 s timeout: the stall window is 2 s, the stream lasts 3 s with a token every 0.5 s
        sidecar = await start_sidecar(url, model={"engine": "openai"}, admission={"requestTimeoutSeconds": 4})
        async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=20, stream=True)) as resp:
            assert resp.status == 200
            text = (await resp.read()).decode()
        assert '"error"' not in text and text.rstrip().endswith('"finish_reason": "stop"}]}'), text
        breaker = sidecar.engine.breaker
        assert breaker.state is BreakerState.CLOSED, breaker.last_trip_reason
        assert breaker._consecutive_failures == 0
        assert "tidegate_admission_ttft_seconds_count" in sidecar.metrics.render().decode()
    finally:
        await runner.cleanup()


async def test_wrong_methods_and_unroutable_paths_get_openai_errors_from_the_sidecar(start_sidecar, http) -> None:
    """405 on the sidecar's own paths (never forwarded) and the router's own 404, in the OpenAI shape."""
    seen: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        if request.path != "/health":  # the sidecar's own health polling
            seen.append(f"{request.method} {request.path}")
        return web.Response(status=405, text="405: Method Not Allowed")

    runner, url = await _upstream({"* /{tail:.*}": anything})
    try:
        sidecar = await start_sidecar(url, model={"engine": "openai"})
        for method, path, allowed in [
            ("GET", "/v1/chat/completions", {"POST"}),
            ("PUT", "/v1/completions", {"POST"}),
            ("POST", "/metrics", {"GET", "HEAD"}),
            ("DELETE", "/tidegate/role", {"PUT"}),
        ]:
            async with http.request(method, sidecar.url + path) as resp:
                assert resp.status == 405, (method, path)
                assert set(resp.headers["Allow"].split(",")) == allowed
                err = error_of(await resp.json())
                assert err["code"] == "method_not_allowed" and err["type"] == "invalid_request_error"
                assert method in err["message"] and path in err["message"]
        assert seen == []  # answered by the sidecar, not the model server
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(sidecar))
        writer.write(b"GET /v1/models%0Ax HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")  # no route matches
        status, headers, body = await _read_reply(reader, timeout_s=5.0)
        writer.close()
        assert status == 404 and headers["content-type"].startswith("application/json")
        err = error_of(json.loads(body))
        assert err["code"] == "not_found" and err["type"] == "invalid_request_error"
        assert seen == []
        async with http.get(sidecar.url + "/v1/models") as resp:  # other paths still reach the model server
            assert resp.status == 405 and seen == ["GET /v1/models"]
    finally:
        await runner.cleanup()


def vllm_page(kv: str = "0.5", waiting: str = "0", running: str = "1") -> str:
    """A vLLM metrics page with the series the sidecar reads (``vllm/v1/metrics/loggers.py``)."""
    return (
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}\n'
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}\n'
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}\n'
        'vllm:generation_tokens_total{engine="0",model_name="m"} 12.0\n'
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1024"} 1.0\n'
    )


@pytest.mark.parametrize(
    ("bad", "on_stale", "status"),
    [("NaN", "failClosed", 503), ("-0.5", "failClosed", 503), ("+Inf", "failOpen", 200), ("1.7", "failOpen", 200)],
)
async def test_a_nonsense_kv_gauge_is_a_missing_signal_not_a_reading(
    start_sidecar, http, caplog, bad: str, on_stale: str, status: int
) -> None:
    """A NaN, infinite or out-of-range KV usage is neither 0 (admit everything) nor 1 (refuse
    everything): the last good reading ages and ``onStale`` decides, as for an unreachable
    ``/metrics``. The sidecar says so once in its log."""
    gauge = {"value": "0.5"}

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=vllm_page(kv=gauge["value"]))

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def completions(_request: web.Request) -> web.Response:
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        return web.json_response({"object": "chat.completion", "choices": [], "usage": usage})

    runner, url = await _upstream(
        {"GET /metrics": metrics, "GET /health": health, "POST /v1/chat/completions": completions}
    )
    try:
        sidecar = await start_sidecar(
            url, admission={"telemetry": {"pollIntervalMs": 50, "staleAfterSeconds": 0.3, "onStale": on_stale}}
        )
        await eventually(lambda: sidecar.engine.kv.value == 0.5, what="the first good reading")
        gauge["value"] = bad
        await eventually(
            lambda: (sidecar.snapshot().telemetry_age_s or 0) > 0.4, what="the nonsense reading to be ignored"
        )
        assert sidecar.engine.kv.value == 0.5  # the last good reading, ageing
        async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=2)) as resp:
            assert resp.status == status, await resp.text()
            if status == 503:
                assert error_of(await resp.json())["code"] == "kv_pressure"
        warnings = [r for r in caplog.records if r.levelname == "WARNING" and "backend metrics" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        gauge["value"] = "0.25"
        await eventually(lambda: sidecar.engine.kv.value == 0.25, what="good readings to count again")
    finally:
        await runner.cleanup()


async def test_the_stall_detector_fires_within_a_short_request_timeout(start_sim, start_sidecar, http) -> None:
    """``requestTimeoutSeconds`` below the 30 s stall window: the hung request would time out (a
    single failure) before a stall could ever be seen. The window is at most half the timeout."""
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url, admission={"requestTimeoutSeconds": 2})  # default BreakerTuning
    async with http.post(sim.url + "/sim/faults", json={"stall": True}) as r:
        assert r.status == 200
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=5)) as resp:
        assert resp.status == 504  # the hung request still ends at its timeout
    breaker = sidecar.engine.breaker
    assert breaker.state is BreakerState.OPEN, "the stall was never detected"
    assert breaker.last_trip_reason.startswith("no token progress for 1 s")
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 503
        assert error_of(await resp.json())["code"] == "circuit_open"


async def test_shed_requests_are_counted_in_metrics_and_stats(start_sim, start_sidecar, http) -> None:
    """In-flight shedding is visible: ``tidegate_admission_shed_total`` and the stats' ``shed_total``."""
    sim = await start_sim(decode_tokens_per_s=20)
    tuning = EngineTuning(prior_s_per_token=0.001, shed_floor_s=0.3)
    sidecar = await start_sidecar(sim.url, admission={"shedAfterMultiple": 2}, tuning=tuning)
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=200)) as resp:
        assert resp.status == 503 and error_of(await resp.json())["code"] == "shed"
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 200  # short enough: not shed
    async with http.get(sidecar.url + "/metrics") as m:
        text = await m.text()
    assert 'tidegate_admission_shed_total{pool="test",priority="interactive",tenant="default"} 1.0' in text
    snap = await stats.fetch(http, sidecar.url)
    assert snap.shed_total == 1 and snap.completed_total == 2


async def test_a_client_expecting_100_continue_is_answered_by_a_backend_that_ignores_expect(start_sidecar) -> None:
    """curl and many HTTP clients send ``Expect: 100-continue`` before a large body. The sidecar
    answers it and reads the whole body itself; forwarded upstream, the expectation made the
    sidecar wait for a 100 from the model server before sending the body it already had, so a
    server that ignores Expect (RFC 9110 allows it) and waits for the body hung the request."""
    answer = json.dumps({"id": "c", "object": "chat.completion", "model": "m",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()  # fmt: skip

    async def ignores_expect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                               if line.startswith(b"content-length:")), 0)  # fmt: skip
                await reader.readexactly(length)  # the body first, never a 100 Continue
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(answer), answer))  # fmt: skip
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(ignores_expect, "127.0.0.1", 0)
    try:
        sidecar = await start_sidecar(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        body = json.dumps(chat(max_tokens=2)).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(sidecar))
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Expect: 100-continue\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body))  # fmt: skip
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)).startswith(b"HTTP/1.1 100")
        writer.write(body)
        status, _, reply = await _read_reply(reader, timeout_s=5.0)
        writer.close()
        assert status == 200, reply
        assert sidecar.snapshot().completed_total == 1
    finally:
        server.close()


async def test_a_trickling_client_that_reads_late_still_gets_its_408(start_sim, start_sidecar) -> None:
    """The slow-loris answer must reach a client that is still sending: a busy client reads it a
    second after the sidecar's deadline, its chunks still going out. Closing at once with its unread
    chunks in the socket made the kernel answer with a reset that threw the 408 away (a clean-clone CI
    run on a loaded machine saw ECONNRESET here); the sidecar now shuts its side, reads and drops
    what still comes for a short while, then closes."""
    import socket

    sim = await start_sim()
    sidecar = await start_sidecar(sim.url, admission={"bodyReadTimeoutSeconds": 0.5})

    def client() -> bytes:
        with socket.create_connection(("127.0.0.1", _port(sidecar)), timeout=5) as s:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            deadline = time.monotonic() + 1.5  # writing, not reading, well past the 0.5 s deadline
            with contextlib.suppress(OSError):
                while time.monotonic() < deadline:
                    s.sendall(b"1\r\n \r\n")
                    time.sleep(0.1)
            raw = b""
            while chunk := s.recv(65536):
                raw += chunk
            return raw

    raw = await asyncio.to_thread(client)
    assert raw.startswith(b"HTTP/1.1 408"), raw[:80]
    assert b"body_read_timeout" in raw
