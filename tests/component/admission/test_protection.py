"""What a client sees when the sidecar protects the model server: gates, breaker, refusals."""

import asyncio

import pytest

from tidegate.admission import stats
from tidegate.admission.breaker import BreakerState, BreakerTuning
from tidegate.admission.engine import EngineTuning

from .helpers import chat, error_of, eventually, sse_events


def retry_after(headers) -> tuple[int, int]:
    seconds, ms = int(headers["Retry-After"]), int(headers["retry-after-ms"])
    assert seconds >= 1 and ms >= 100
    assert seconds == max(1, -(-ms // 1000))  # whole seconds, rounded up from the same estimate
    return seconds, ms


async def test_frozen_kv_gauge_with_nothing_in_flight_reopens_the_gate(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url, tuning=EngineTuning(frozen_after_s=1.0))
    async with http.post(sim.url + "/sim/faults", json={"freeze_metrics": {"kv_cache_usage_perc": 0.99}}) as r:
        assert r.status == 200
    await eventually(lambda: sidecar.engine.kv.value == 0.99, what="the sidecar read 99% KV usage")
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 503
        assert error_of(await resp.json())["code"] == "kv_pressure"
        retry_after(resp.headers)

    async def admitted() -> bool:
        async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
            return resp.status == 200

    for _ in range(100):  # the gauge never moves: after 1 s idle it is not evidence of pressure
        if await admitted():
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the gate never reopened on a frozen gauge")
    assert sidecar.engine.kv.value == 0.99


async def test_stalled_upstream_opens_the_breaker_with_retry_after(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    tuning = EngineTuning(breaker=BreakerTuning(stall_s=0.5))
    sidecar = await start_sidecar(sim.url, tuning=tuning)
    async with http.post(sim.url + "/sim/faults", json={"stall": True}) as r:
        assert r.status == 200
    hung = asyncio.ensure_future(http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=5)))
    await eventually(lambda: sidecar.engine.breaker_state is BreakerState.OPEN, what="breaker open")
    async with http.get(sim.url + "/health") as health:
        assert health.status == 200  # /health still answers: only token progress tells
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 503
        assert error_of(await resp.json())["code"] == "circuit_open"
        seconds, _ = retry_after(resp.headers)
        assert 55 <= seconds <= 60
    async with http.get(sidecar.url + "/tidegate/stats") as stats:
        assert (await stats.json())["breaker_state"] == "open"
    hung.cancel()
    await eventually(lambda: sidecar.engine.in_flight_requests == 0, what="the hung request released")


@pytest.mark.parametrize(
    ("data", "status", "code"),
    [
        (b"not json", 400, "bad_request"),
        (b'{"model": "m", "messages": "hi"}', 400, "bad_request"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}', 400, "bad_request"),
        (b'{"model": "m"}', 400, "bad_request"),
        (b"[1, 2, 3]", 400, "bad_request"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}', 413, "request_body_too_large"),
        (b'{"model": "m", "prompt": [' + b"1," * 999 + b'1]}', 400, "context_length_exceeded"),
    ],
)  # fmt: skip
async def test_malformed_bodies_are_refused_and_nothing_leaks(
    start_sim, start_sidecar, http, data, status, code
) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url, admission={"maxRequestBytes": 4096}, model={"maxContextTokens": 512})
    path = "/v1/completions" if b'"prompt"' in data else "/v1/chat/completions"
    async with http.post(sidecar.url + path, data=data, headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == status
        assert error_of(await resp.json())["code"] == code
        assert "Retry-After" not in resp.headers  # retrying the same body cannot help
    engine = sidecar.engine
    assert engine.in_flight_requests == engine.in_flight_tokens == engine.queue.depth == 0
    assert all(s.accepted == 0 for s in engine.tenants.states.values())
    assert sim.model.num_running == 0  # nothing reached the backend
    assert sum(engine.counters.rejected_total.values()) == 1


async def test_tenant_over_quota_gets_429_with_an_honest_retry(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(
        sim.url,
        admission={
            "tenancy": {"identity": "header", "tenants": [{"name": "acme", "tokensPerSecond": 50, "burstTokens": 100}]}
        },
    )
    headers = {"x-tenant-id": "acme"}
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=60), headers=headers) as resp:
        assert resp.status == 200
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=60), headers=headers) as resp:
        assert resp.status == 429
        assert error_of(await resp.json())["code"] == "tenant_rate"
        _, ms = retry_after(resp.headers)
        assert 100 <= ms <= 2000  # the refill time of the missing tokens at 50 tokens/s
    async with http.post(
        sidecar.url + "/v1/chat/completions", json=chat(max_tokens=60), headers={"x-tenant-id": "other"}
    ) as resp:
        assert resp.status == 200  # other tenants are not affected
    async with http.get(sidecar.url + "/metrics") as m:
        text = await m.text()
    assert (
        'tidegate_admission_decisions_total{decision="reject",pool="test",priority="interactive",'
        'reason="tenant_rate",tenant="acme"} 1.0' in text
    )


async def test_openai_client_backs_off_on_429_and_succeeds(start_sim, start_sidecar) -> None:
    openai = pytest.importorskip("openai")
    sim = await start_sim(decode_tokens_per_s=10_000)  # answers at once: only the bucket makes it wait
    sidecar = await start_sidecar(
        sim.url, admission={"tenancy": {"default": {"tokensPerSecond": 100, "burstTokens": 150}}}
    )
    client = openai.AsyncOpenAI(base_url=sidecar.url + "/v1", api_key="unused", max_retries=3)
    try:
        await client.chat.completions.create(
            model="sim-llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=100
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        reply = await client.chat.completions.create(
            model="sim-llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=100
        )
        waited = loop.time() - started
    finally:
        await client.close()
    assert reply.choices[0].message.content
    rejected = sidecar.engine.counters.rejected_total
    assert sum(rejected.values()) >= 1 and set(rejected) == {"tenant_rate"}
    assert waited >= 0.5  # it waited for the bucket to refill instead of hammering
    assert sidecar.engine.counters.admitted_total == 2


async def test_a_replica_not_in_the_active_role_refuses_and_is_not_ready(
    start_sim, start_sidecar, http, tmp_path
) -> None:
    sim = await start_sim()
    labels = tmp_path / "labels"
    labels.write_text('app="x"\ntidegate.dev/role="warm"\n')
    sidecar = await start_sidecar(sim.url, labels_file=str(labels), reload_s=0.05)
    async with http.get(sidecar.url + "/readyz") as ready:
        assert ready.status == 503
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 503
        assert error_of(await resp.json())["code"] == "not_active"
        retry_after(resp.headers)
    labels.write_text('app="x"\ntidegate.dev/role="active"\n')  # promoted by the operator
    await eventually(lambda: sidecar.role == "active", what="role reloaded")
    async with http.get(sidecar.url + "/readyz") as ready:
        assert ready.status == 200
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 200


async def test_draining_refuses_new_requests_and_lets_in_flight_finish(start_sim, start_sidecar, http) -> None:
    sim = await start_sim(decode_tokens_per_s=50)
    sidecar = await start_sidecar(sim.url)
    running = asyncio.ensure_future(http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=25)))
    await eventually(lambda: sidecar.engine.in_flight_requests == 1)
    drain = asyncio.ensure_future(http.get(sidecar.url + "/tidegate/drain?wait=true"))
    await eventually(lambda: sidecar.draining)
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 503 and error_of(await resp.json())["code"] == "not_active"
    async with http.get(sidecar.url + "/readyz") as ready:
        assert ready.status == 503
    finished = await running
    assert finished.status == 200  # the in-flight generation was not cut short
    finished.release()
    done = await drain
    assert (await done.json())["done"] is True
    done.release()


async def test_stats_follow_the_contract(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url)
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 200
    snap = await stats.fetch(http, sidecar.url)
    assert snap.admitted_total == 1 and snap.completed_total == 1 and snap.pool == "test"
    assert snap.in_flight_requests == 0 and snap.breaker_state is stats.BreakerState.CLOSED


async def test_api_key_identity_maps_keys_to_tenants_and_refuses_unknown_keys(
    start_sim, start_sidecar, http, tmp_path
) -> None:
    import hashlib

    (tmp_path / "acme").write_text(hashlib.sha256(b"sk-acme").hexdigest() + "\n")
    sim = await start_sim()
    sidecar = await start_sidecar(
        sim.url, admission={"tenancy": {"identity": "apiKey", "apiKeySecret": "keys"}}, api_keys_dir=str(tmp_path)
    )
    for auth in ({}, {"Authorization": "Bearer sk-unknown"}):
        async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2), headers=auth) as resp:
            assert resp.status == 401
            assert error_of(await resp.json())["code"] == "unauthorized"
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2),
                         headers={"Authorization": "Bearer sk-acme"}) as resp:  # fmt: skip
        assert resp.status == 200
    assert sidecar.engine.counters.tenants["acme"].admitted == 1
    assert sim.model.num_running == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_running_far_past_its_prediction_is_shed(start_sim, start_sidecar, http, stream: bool) -> None:
    sim = await start_sim(decode_tokens_per_s=20)
    tuning = EngineTuning(prior_s_per_token=0.001, shed_floor_s=0.3)
    sidecar = await start_sidecar(sim.url, admission={"shedAfterMultiple": 2}, tuning=tuning)
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=200, stream=stream)) as resp:
        if stream:
            assert resp.status == 200
            events = await sse_events(resp)
            assert error_of(events[-1][1])["code"] == "shed"
        else:
            assert resp.status == 503
            assert error_of(await resp.json())["code"] == "shed"
            retry_after(resp.headers)
    await eventually(lambda: sidecar.engine.in_flight_requests == 0, what="the shed request released")
    await eventually(lambda: sim.model.num_running == 0, what="the backend aborted it")


async def test_client_headers_never_create_metric_series(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url, admission={"tenancy": {"identity": "header", "metricsTopTenants": 1}})
    for i in range(5):
        headers = {"x-priority": f"made-up-{i}", "x-tenant-id": f"tenant-{i}"}
        async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2), headers=headers) as resp:
            assert resp.status == 400  # unknown class
    async with http.get(sidecar.url + "/metrics") as m:
        text = await m.text()
    series = [line for line in text.splitlines() if line.startswith("tidegate_admission_decisions_total{")]
    assert len(series) == 2  # tenant-0 and other, priority "unknown" for both
    assert all('priority="unknown"' in line for line in series)
    assert "made-up" not in text
