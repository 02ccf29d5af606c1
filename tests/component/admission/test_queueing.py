"""Queueing and recovery as clients see them over HTTP: timeouts, displacement, half-open, metrics."""

import asyncio

from tidegate.admission.breaker import BreakerState, BreakerTuning
from tidegate.admission.engine import EngineTuning

from .helpers import chat, error_of, eventually, sse_events

BATCH = {"x-priority": "batch"}
URL = "/v1/chat/completions"


async def test_a_request_waiting_too_long_gets_503_queue_timeout(start_sim, start_sidecar, http) -> None:
    sim = await start_sim(decode_tokens_per_s=20)
    optimistic = EngineTuning(prior_duration_s=0.1)  # predicts a quick start: it queues, then times out
    sidecar = await start_sidecar(
        sim.url, admission={"maxConcurrency": 1, "queue": {"maxWaitMs": 300}}, tuning=optimistic
    )
    running = await http.post(sidecar.url + URL, json=chat(max_tokens=100, stream=True))
    await sse_events(running, limit=1)
    async with http.post(sidecar.url + URL, json=chat(max_tokens=2), headers=BATCH) as resp:
        assert resp.status == 503
        assert error_of(await resp.json())["code"] == "queue_timeout"
        assert int(resp.headers["Retry-After"]) >= 1
    running.close()
    await eventually(lambda: sidecar.engine.in_flight_requests == 0 and sidecar.engine.queue.depth == 0)


async def test_an_interactive_arrival_displaces_queued_batch_work(start_sim, start_sidecar, http) -> None:
    sim = await start_sim(decode_tokens_per_s=20)
    admission = {"maxConcurrency": 2, "queue": {"maxDepth": 1, "maxWaitMs": 30_000},
                 "priorityClasses": [{"name": "interactive", "ttftSloMs": 30_000},
                                     {"name": "batch", "ttftSloMs": 60_000}]}  # fmt: skip
    sidecar = await start_sidecar(sim.url, admission=admission)
    running = await http.post(sidecar.url + URL, json=chat(max_tokens=8, stream=True))
    await sse_events(running, limit=1)
    other = await http.post(sidecar.url + URL, json=chat(max_tokens=8, stream=True))
    await sse_events(other, limit=1)
    batch = asyncio.ensure_future(http.post(sidecar.url + URL, json=chat(max_tokens=2), headers=BATCH))
    await eventually(lambda: sidecar.engine.queue.depth == 1, what="batch request queued")
    vip = asyncio.ensure_future(http.post(sidecar.url + URL, json=chat(max_tokens=2)))
    displaced = await batch
    assert displaced.status == 503
    assert error_of(await displaced.json())["code"] == "queue_full"
    assert "Retry-After" in displaced.headers
    displaced.release()
    await sse_events(running)
    running.release()
    answer = await vip
    assert answer.status == 200  # the interactive request got the slot
    answer.release()
    other.close()


async def test_the_breaker_recovers_through_half_open_probes(start_sim, start_sidecar, http) -> None:
    sim = await start_sim(decode_tokens_per_s=500)
    tuning = EngineTuning(breaker=BreakerTuning(stall_s=0.3))
    breaker = {"cooldownSeconds": 0.5, "maxCooldownSeconds": 1, "halfOpenRequests": 3}
    sidecar = await start_sidecar(sim.url, admission={"circuitBreaker": breaker}, tuning=tuning)
    async with http.post(sim.url + "/sim/faults", json={"stall": True}) as r:
        assert r.status == 200
    hung = asyncio.ensure_future(http.post(sidecar.url + URL, json=chat(max_tokens=2)))
    await eventually(lambda: sidecar.engine.breaker_state is BreakerState.OPEN, what="breaker open")
    hung.cancel()
    async with http.post(sim.url + "/sim/faults", json={"clear": True}) as r:
        assert r.status == 200  # the backend recovers
    statuses = []
    for _ in range(60):
        async with http.post(sidecar.url + URL, json=chat(max_tokens=2)) as resp:
            statuses.append(resp.status)
        if sidecar.engine.breaker_state is BreakerState.CLOSED:
            break
        await asyncio.sleep(0.05)
    assert sidecar.engine.breaker_state is BreakerState.CLOSED
    assert 200 in statuses and 503 in statuses  # refused while open, probed, then closed
    async with http.post(sidecar.url + URL, json=chat(max_tokens=2)) as resp:
        assert resp.status == 200


async def test_metrics_show_latency_slo_and_state(start_sim, start_sidecar, http) -> None:
    sim = await start_sim(decode_tokens_per_s=1000)
    sidecar = await start_sidecar(sim.url)
    async with http.post(sidecar.url + URL, json=chat(max_tokens=3, stream=True)) as resp:
        await sse_events(resp)
    async with http.get(sidecar.url + "/metrics") as m:
        assert m.status == 200
        text = await m.text()
    for needle in (
        'tidegate_admission_ttft_seconds_count{pool="test",priority="interactive"} 1.0',
        'tidegate_admission_e2e_seconds_count{pool="test",priority="interactive"} 1.0',
        'tidegate_admission_slo_total{met="true",pool="test",priority="interactive"} 1.0',
        'tidegate_admission_breaker_state{pool="test",state="closed"} 1.0',
        'tidegate_admission_in_flight_requests{pool="test"} 0.0',
        'tidegate_admission_token_budget{pool="test"} 65536.0',
    ):
        assert needle in text, needle
