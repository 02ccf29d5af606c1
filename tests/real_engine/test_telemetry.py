"""What the sidecar reads from a real llama-server, and that it says so when it cannot."""

import asyncio
import math
import time

import aiohttp

from .conftest import get, wait_until
from .helpers import CTX_PER_SLOT, GREEDY, SLOTS, completion, post

TOKENS = 600


def test_the_servers_slots_and_load_are_read(llama_server, start_sidecar):
    sidecar = start_sidecar()
    stats = wait_until(lambda: (s := sidecar.stats())["backend_slots"] is not None and s, 10, "a telemetry read")
    assert stats["telemetry_ok"] is True and stats["telemetry_error"] is None
    assert stats["backend_slots"] == SLOTS and stats["backend_context_tokens"] == CTX_PER_SLOT
    assert stats["backend_requests_running"] == 0 and stats["backend_requests_queued"] == 0
    assert (
        stats["telemetry_age_s"] is not None and stats["telemetry_age_s"] < 5
    )  # /metrics is read, not just a KV gauge


async def test_long_non_streamed_generation_is_progress_not_a_stall(llama_server, start_sidecar):
    """llama.cpp adds to ``tokens_predicted_total`` only when a request ends; the sidecar watches
    its decode steps instead, so a non-streamed answer longer than the stall window is no stall.

    The stall window is min(30 s, requestTimeoutSeconds / 2); the timeout is 1.4 x the time the
    same answer took directly just before, so the answer takes about 1.4 stall windows and 0.7 of
    the timeout (the geometric middle of the band in which a false stall would show).
    """
    body = completion("Write a long story:", max_tokens=TOKENS, ignore_eos=True, **GREEDY)
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        status, _, _ = await post(session, llama_server.url + "/v1/completions", body)
        assert status == 200
        expected_s = time.monotonic() - started
        sidecar = start_sidecar(admission={"requestTimeoutSeconds": max(4, math.ceil(1.4 * expected_s))})
        before = llama_server.metric("tokens_predicted_total")
        answer = asyncio.create_task(post(session, sidecar.url + "/v1/completions", body))
        decode_steps = llama_server.metric("n_decode_total")
        await asyncio.to_thread(
            wait_until, lambda: llama_server.metric("n_decode_total") > decode_steps + 10, 30, "decode steps"
        )
        # the premise: the server's token counter has not moved yet, its decode-step counter has
        assert not answer.done() and llama_server.metric("tokens_predicted_total") == before
        status, doc, _ = await answer
    assert status == 200, doc
    assert doc["usage"]["completion_tokens"] == TOKENS
    assert sidecar.stats()["breaker_state"] == "closed"


def test_an_unreadable_metrics_path_is_loud(llama_server, start_sidecar):
    sidecar = start_sidecar(server={"metricsPath": "/no-such-metrics"})
    stats = wait_until(lambda: (s := sidecar.stats())["telemetry_ok"] is False and s, 10, "telemetry to fail")
    assert "/no-such-metrics" in stats["telemetry_error"]
    assert sidecar.metric("tidegate_admission_telemetry_errors_total") >= 1
    wait_until(lambda: "WARNING" in sidecar.log_text(), 5, "a WARNING in the sidecar's log")


def test_a_pool_that_sets_no_budget_runs_on_what_the_server_holds(llama_server, start_sidecar):
    """``tokenBudget`` and ``maxConcurrency`` unset (the pool as a user writes it by default): the
    sidecar reads llama-server's /slots and runs each replica on its 2 slots x 1024 tokens, ready
    (``/tidegate/ready``) once it knows."""
    sidecar = start_sidecar()
    stats = wait_until(lambda: (s := sidecar.stats())["token_budget_source"] == "engine" and s, 10, "sizing")
    assert stats["token_budget"] == SLOTS * CTX_PER_SLOT == 2048
    assert stats["max_concurrency"] == SLOTS and stats["max_concurrency_source"] == "engine"
    assert stats["config_warnings"] == []
    assert get(sidecar.url + "/tidegate/ready")[0] == 200
    assert "admission sizing: token budget 2048 (engine), max concurrency 2 (engine)" in sidecar.log_text()


def test_a_config_that_does_not_match_the_server_is_named(llama_server, start_sidecar):
    """examples/llamacpp.yaml's sizing (4 slots of 8192) in front of this 2 x 1024 server."""
    sidecar = start_sidecar(admission={"tokenBudget": 32768, "maxConcurrency": 4}, maxContextTokens=8192)
    stats = wait_until(lambda: (s := sidecar.stats())["config_warnings"] and s, 10, "a config warning")
    assert len(stats["config_warnings"]) == 3
    wait_until(lambda: "config does not match the model server" in sidecar.log_text(), 5, "the WARNING")
