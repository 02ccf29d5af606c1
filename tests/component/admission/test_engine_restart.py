"""A model server that restarts with another shape under a running sidecar (issue #13): a budget and
concurrency the sidecar read from the server follow it at once, loudly; numbers the pool sets do not.
And while a replica is still reading its capacity, its stats say it does not know its numbers."""

import asyncio
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tidegate.admission.engine import EngineTuning
from tidegate.admission.reasons import CAPACITY_REASONS

from .helpers import chat, error_of, eventually, fake_upstream
from .test_telemetry import FakeLlamaServer

pytestmark = pytest.mark.component

AUTO = {"tokenBudget": None, "maxConcurrency": None}
LLAMA = {"engine": "llamacpp", "maxContextTokens": 1024}
RESIZED_WITHIN_S = 3.0  # far below the 60 s periodic re-read: only the restart itself can explain it


class ReshapingLlamaServer(FakeLlamaServer):
    """A fake llama-server whose shape (``slots`` x ``n_ctx`` per slot, as ``/slots`` lists them)
    can change as a restart with other ``--parallel`` / ``--ctx-size`` would change it; chats wait
    for :attr:`release` while it is clear."""

    def __init__(self) -> None:
        super().__init__()
        self.shape = (2, 1024)
        self.release = asyncio.Event()
        self.release.set()

    async def _slots(self, _request: web.Request) -> web.Response:
        slots, n_ctx = self.shape
        return web.json_response([{"id": i, "n_ctx": n_ctx, "is_processing": False} for i in range(slots)])

    async def _chat(self, request: web.Request) -> web.Response:
        await self.release.wait()
        return await super()._chat(request)


async def stats_of(http: aiohttp.ClientSession, sidecar: Any) -> dict[str, Any]:
    async with http.get(sidecar.url + "/tidegate/stats") as resp:
        assert resp.status == 200
        return await resp.json()


async def until_stats(http: aiohttp.ClientSession, sidecar: Any, check: Any, timeout_s: float) -> dict[str, Any]:
    """The first stats document ``check`` accepts, polled every 20 ms; fail after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        doc = await stats_of(http, sidecar)
        if check(doc):
            return doc
        assert asyncio.get_running_loop().time() < deadline, f"timed out after {timeout_s} s; last stats {doc}"
        await asyncio.sleep(0.02)


def numbers(doc: dict[str, Any]) -> tuple[Any, ...]:
    return doc["token_budget"], doc["max_concurrency"], doc["token_budget_source"], doc["max_concurrency_source"]


async def test_a_server_restarted_with_fewer_slots_shrinks_the_sidecar_at_once(
    start_sidecar, http, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with ReshapingLlamaServer() as server:
        sidecar = await start_sidecar(server.url, admission=AUTO, model=LLAMA)
        await until_stats(http, sidecar, lambda d: numbers(d) == (2048, 2, "engine", "engine"), 5.0)

        server.release.clear()
        first = asyncio.create_task(http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=4)))
        await eventually(lambda: sidecar.engine.in_flight_requests == 1, what="the first request admitted")
        server.health = 503  # killed, restarted with --parallel 1, loading
        await eventually(lambda: not sidecar.backend_healthy, what="the sidecar seeing the server down")
        server.shape, server.health = (1, 1024), 200

        doc = await until_stats(http, sidecar, lambda d: d["max_concurrency"] == 1, RESIZED_WITHIN_S)
        assert numbers(doc) == (1024, 1, "engine", "engine")
        assert (doc["backend_slots"], doc["sizing_changes_total"], doc["in_flight_requests"]) == (1, 1, 1)
        changed = [r.getMessage() for r in caplog.records if "sizing changed" in r.getMessage()]
        assert len(changed) == 1 and "2048 -> 1024" in changed[0] and "2 -> 1" in changed[0], changed

        # one slot now, and it is taken: a second request is refused for capacity, not run beside it
        async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=4)) as resp:
            assert resp.status == 503 and error_of(await resp.json())["code"] in CAPACITY_REASONS
        assert sidecar.engine.in_flight_requests == 1
        server.release.set()
        async with await first as resp:
            assert resp.status == 200
        doc = await until_stats(http, sidecar, lambda d: d["in_flight_requests"] == 0, 5.0)
        assert (doc["in_flight_tokens"], doc["queue_depth"], doc["admitted_total"]) == (0, 0, 1)  # nothing leaked
        async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=4)) as resp:
            assert resp.status == 200  # the slot is free again


async def test_a_restart_missed_by_the_health_check_is_seen_by_the_progress_counter(start_sidecar, http) -> None:
    async with ReshapingLlamaServer() as server:
        sidecar = await start_sidecar(server.url, admission=AUTO, model=LLAMA)
        await until_stats(http, sidecar, lambda d: numbers(d) == (2048, 2, "engine", "engine"), 5.0)
        async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=4)) as resp:
            assert resp.status == 200
        await eventually(lambda: sidecar.engine._last_generation_total == 2, what="the progress counter read")
        # restarted between two health checks: never seen down, but its counters start again from 0
        server.shape, server.predicted = (4, 4096), 0
        doc = await until_stats(http, sidecar, lambda d: d["max_concurrency"] == 4, RESIZED_WITHIN_S)
        assert numbers(doc) == (16384, 4, "engine", "engine") and doc["sizing_changes_total"] == 1


async def test_numbers_the_pool_sets_never_follow_the_server(start_sidecar, http) -> None:
    async with ReshapingLlamaServer() as server:
        sidecar = await start_sidecar(server.url, admission={"tokenBudget": 2048, "maxConcurrency": 2}, model=LLAMA)
        await until_stats(http, sidecar, lambda d: d["backend_slots"] == 2, 5.0)
        server.health = 503
        await eventually(lambda: not sidecar.backend_healthy, what="the sidecar seeing the server down")
        server.shape, server.health = (1, 1024), 200
        doc = await until_stats(http, sidecar, lambda d: d["backend_slots"] == 1, RESIZED_WITHIN_S)
        assert numbers(doc) == (2048, 2, "configured", "configured") and doc["sizing_changes_total"] == 0
        assert any("maxConcurrency 2" in w and "1 slots" in w for w in doc["config_warnings"]), doc["config_warnings"]


async def _ok(_request: web.Request) -> web.Response:
    return web.json_response({"object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 1}})


async def test_a_replica_still_reading_its_capacity_shows_no_numbers(start_sidecar, http) -> None:
    async with fake_upstream({"/v1/chat/completions": _ok}) as upstream:  # reports no capacity (yet)
        sidecar = await start_sidecar(upstream, admission=AUTO, tuning=EngineTuning(capacity_wait_s=60.0))
        doc = await stats_of(http, sidecar)
        # not a made-up 65536 / 64 beside "pending": a reader must not take them for capacity
        assert numbers(doc) == (None, None, "pending", "pending")
        async with http.get(sidecar.url + "/metrics") as resp:
            page = await resp.text()
        assert 'tidegate_admission_token_budget{pool="test"} NaN' in page
        assert 'tidegate_admission_max_concurrency{pool="test"} NaN' in page
