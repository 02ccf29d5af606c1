"""Disconnects, fault switches and /metrics of the sim-backend, over loopback."""

import asyncio
import os
import socket
import subprocess
import sys
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.component.sim.helpers import chat_body, read_sse, scrape, wait_for


async def _state(http, sim) -> dict:
    async with http.get(sim.url + "/sim/state") as resp:
        return await resp.json()


async def _faults(http, sim, patch: dict) -> dict:
    async with http.post(sim.url + "/sim/faults", json=patch) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _running(http, sim) -> float:
    return (await scrape(http, sim))["vllm:num_requests_running"]


async def test_metrics_parse_and_carry_the_vllm_names(start_sim, http) -> None:
    sim = await start_sim(decode_tokens_per_s=1000)
    async with http.post(sim.url + "/v1/completions", json={"prompt": "x" * 40, "max_tokens": 6}) as resp:
        assert resp.status == 200
    async with http.get(sim.url + "/metrics") as resp:
        text = await resp.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert families[gauge].type == "gauge"
        assert families[gauge].samples[0].labels == {"model_name": "sim-llama-3.1-8b", "engine": "0"}
    for counter in ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_preemptions"):
        assert families[counter].type == "counter"
    for hist in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        assert families[hist].type == "histogram"
    samples = await scrape(http, sim)
    assert samples["vllm:prompt_tokens_total"] == 10
    assert samples["vllm:generation_tokens_total"] == 6
    assert samples["vllm:time_to_first_token_seconds_count"] == 1
    assert samples["vllm:e2e_request_latency_seconds_count"] == 1
    assert samples["vllm:inter_token_latency_seconds_count"] == 5
    assert samples["vllm:num_requests_running"] == samples["vllm:kv_cache_usage_perc"] == 0


async def test_two_servers_in_one_process_keep_separate_metrics(start_sim, http) -> None:
    a, b = await start_sim(), await start_sim()
    async with http.post(a.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as resp:
        assert resp.status == 200
    assert (await scrape(http, a))["vllm:generation_tokens_total"] == 2
    assert (await scrape(http, b))["vllm:generation_tokens_total"] == 0


async def test_client_disconnect_mid_stream_aborts_and_frees_kv(start_sim, http) -> None:
    sim = await start_sim(decode_tokens_per_s=50)
    resp = await http.post(sim.url + "/v1/chat/completions", json=chat_body(max_tokens=1000, stream=True))
    for _ in range(3):
        await resp.content.readline()
    assert await _running(http, sim) == 1
    assert (await scrape(http, sim))["vllm:kv_cache_usage_perc"] > 0
    resp.close()  # drop the connection mid-stream
    await wait_for(lambda: _running_is(http, sim, 0))
    samples = await scrape(http, sim)
    assert samples["vllm:kv_cache_usage_perc"] == 0
    assert samples["vllm:generation_tokens_total"] < 100
    assert (await _state(http, sim))["aborted_total"] == 1
    async with http.post(sim.url + "/v1/completions", json={"prompt": "next", "max_tokens": 2}) as after:
        assert after.status == 200  # the next request is served


async def _running_is(http, sim, value: float) -> bool:
    return await _running(http, sim) == value


async def test_client_gone_while_waiting_leaves_the_queue(start_sim, http) -> None:
    sim = await start_sim(decode_tokens_per_s=50, max_running=1)
    first = await http.post(sim.url + "/v1/chat/completions", json=chat_body(max_tokens=1000, stream=True))
    waiting = asyncio.create_task(http.post(sim.url + "/v1/completions", json={"prompt": "q", "max_tokens": 5}))
    await wait_for(lambda: _waiting_is(http, sim, 1))
    waiting.cancel()
    first.close()
    await wait_for(lambda: _waiting_is(http, sim, 0))
    await wait_for(lambda: _running_is(http, sim, 0))
    assert (await _state(http, sim))["aborted_total"] == 2


async def _waiting_is(http, sim, value: float) -> bool:
    return (await scrape(http, sim))["vllm:num_requests_waiting"] == value


async def test_stall_accepts_but_emits_nothing_while_health_stays_ok(start_sim, http) -> None:
    sim = await start_sim(decode_tokens_per_s=200)
    await _faults(http, sim, {"stall": True})
    resp = await http.post(sim.url + "/v1/chat/completions", json=chat_body(max_tokens=5, stream=True))
    assert resp.status == 200  # headers come, tokens do not
    read = asyncio.create_task(read_sse(resp))
    await asyncio.sleep(0.3)
    assert not read.done()
    async with http.get(sim.url + "/health") as health:
        assert health.status == 200
    assert await _running(http, sim) == 1  # in flight, no progress: what a hung engine looks like
    assert (await scrape(http, sim))["vllm:generation_tokens_total"] == 0
    await _faults(http, sim, {"stall": False})
    events = await asyncio.wait_for(read, 2)
    assert events[-1][1] == "[DONE]" and len(events) == 1 + 5 + 1


async def test_slowdown_stretches_generation(start_sim, http) -> None:
    sim = await start_sim(decode_tokens_per_s=100)

    async def e2e() -> float:
        t0 = time.monotonic()
        async with http.post(sim.url + "/v1/completions", json={"prompt": "p", "max_tokens": 16}) as resp:
            assert resp.status == 200
        return time.monotonic() - t0

    base = await e2e()
    await _faults(http, sim, {"slowdown": 3})
    slowed = await e2e()
    assert 2.2 < slowed / base < 3.8, (base, slowed)


async def test_error_and_reject_rates(start_sim, http) -> None:
    sim = await start_sim(decode_tokens_per_s=10_000, seed=7)

    async def statuses(count: int) -> list[int]:
        out = []
        for _ in range(count):
            async with http.post(sim.url + "/v1/completions", json={"prompt": "p", "max_tokens": 1}) as resp:
                out.append(resp.status)
                if resp.status == 429:
                    assert resp.headers["Retry-After"] == "1"
                if resp.status != 200:
                    assert (await resp.json())["error"]["code"] == resp.status
        return out

    await _faults(http, sim, {"error_rate": 1})
    assert set(await statuses(3)) == {500}
    await _faults(http, sim, {"error_rate": 0, "reject_rate": 1})
    assert set(await statuses(3)) == {429}
    await _faults(http, sim, {"reject_rate": 0, "error_rate": 0.5})
    errors = (await statuses(60)).count(500)
    assert 15 < errors < 45
    await _faults(http, sim, {"clear": True})
    assert set(await statuses(3)) == {200}
    async with http.get(sim.url + "/health") as resp:
        assert resp.status == 200


async def test_frozen_metrics_keep_gauges_while_counters_move(start_sim, http) -> None:
    sim = await start_sim(decode_tokens_per_s=200)
    resp = await http.post(sim.url + "/v1/chat/completions", json=chat_body(max_tokens=1000, stream=True))
    await resp.content.readline()
    await _faults(http, sim, {"freeze_metrics": True})
    resp.close()
    await wait_for(lambda: _model_running_is(http, sim, 0))
    before = await scrape(http, sim)
    assert before["vllm:num_requests_running"] == 1 and before["vllm:kv_cache_usage_perc"] > 0  # stale
    async with http.post(sim.url + "/v1/completions", json={"prompt": "p", "max_tokens": 3}) as done:
        assert done.status == 200
    after = await scrape(http, sim)
    assert after["vllm:generation_tokens_total"] > before["vllm:generation_tokens_total"]
    assert after["vllm:num_requests_running"] == 1
    await _faults(http, sim, {"freeze_metrics": {"kv_cache_usage_perc": 0.99}})
    assert (await scrape(http, sim))["vllm:kv_cache_usage_perc"] == 0.99
    await _faults(http, sim, {"freeze_metrics": False})
    live = await scrape(http, sim)
    assert live["vllm:num_requests_running"] == 0 and live["vllm:kv_cache_usage_perc"] == 0


async def _model_running_is(http, sim, value: int) -> bool:
    return (await _state(http, sim))["num_requests_running"] == value


async def test_bad_fault_patches_are_refused(start_sim, http) -> None:
    sim = await start_sim()
    async with http.post(sim.url + "/sim/faults", json={"error_rate": 3}) as resp:
        assert resp.status == 400
        assert "error_rate" in (await resp.json())["error"]["message"]
    async with http.get(sim.url + "/sim/faults") as resp:
        assert (await resp.json())["error_rate"] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_the_cli_serves_with_faults_from_flags(http) -> None:
    port = _free_port()
    cmd = [sys.executable, "-m", "tidegate.cli.main", "sim-backend", "--listen", f"127.0.0.1:{port}"]
    cmd += ["--model", "m", "--max-running", "4", "--kv-capacity-tokens", "4096", "--fault", "reject_rate=1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        url = f"http://127.0.0.1:{port}"

        async def up() -> bool:
            try:
                async with http.get(url + "/health") as resp:
                    return resp.status == 200
            except aiohttp.ClientConnectionError:
                assert proc.poll() is None, proc.stdout.read().decode()
                return False

        await wait_for(up, timeout_s=15)
        async with http.post(url + "/v1/completions", json={"model": "m", "prompt": "p"}) as resp:
            assert resp.status == 429
        async with http.get(url + "/v1/models") as resp:
            assert (await resp.json())["data"][0]["max_model_len"] == 4096
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
