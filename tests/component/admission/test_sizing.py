"""A pool that sets neither ``tokenBudget`` nor ``maxConcurrency``: each sidecar sizes itself from
the model server in front of which it runs, is not ready before it knows, and says loudly when the
server reports nothing and it runs on the fallback."""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from tidegate.admission.engine import EngineTuning
from tidegate.api.admission import FALLBACK_MAX_CONCURRENCY, FALLBACK_TOKEN_BUDGET

from .helpers import chat, error_of, fake_upstream

pytestmark = pytest.mark.component

AUTO = {"tokenBudget": None, "maxConcurrency": None}


async def until(check: Callable[[], Awaitable[Any]], timeout_s: float = 10.0) -> Any:
    """Await ``check`` every 20 ms until it returns something truthy (returned); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (found := await check()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s"
        await asyncio.sleep(0.02)
    return found


def post(http, url: str):
    return http.post(url + "/v1/chat/completions", json=chat(max_tokens=4))


async def _ok(_request: web.Request) -> web.Response:
    return web.json_response(
        {"id": "x", "object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 1, "total_tokens": 2}}
    )


async def test_in_front_of_the_sim_backend_the_budget_is_its_kv_cache(start_sim, start_sidecar, http) -> None:
    sim = await start_sim(kv_capacity_tokens=100_000)
    sidecar = await start_sidecar(sim.url, admission=AUTO)

    async def sized() -> dict | None:
        async with http.get(sidecar.url + "/tidegate/stats") as resp:
            stats = await resp.json()
        return stats if stats["token_budget_source"] == "engine" else None

    stats = await until(sized)
    assert (stats["token_budget"], stats["max_concurrency"]) == (100_000, 256)  # vLLM's default --max-num-seqs
    assert stats["backend_kv_capacity_tokens"] == 100_000 and stats["config_warnings"] == []
    async with http.get(sidecar.url + "/tidegate/ready") as resp:
        assert resp.status == 200
    async with post(http, sidecar.url) as resp:
        assert resp.status == 200


async def test_a_server_that_reports_no_capacity_is_not_ready_then_falls_back_loudly(
    start_sidecar, http, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with fake_upstream({"/v1/chat/completions": _ok}) as upstream:  # no /metrics: no cache_config_info
        sidecar = await start_sidecar(
            upstream, admission={**AUTO, "queue": {"maxWaitMs": 100}}, tuning=EngineTuning(capacity_wait_s=1.0)
        )
        async with http.get(sidecar.url + "/tidegate/ready") as resp:
            assert resp.status == 503 and (await resp.json())["token_budget_source"] == "pending"
        async with post(http, sidecar.url) as resp:  # never admitted on a guess
            assert resp.status == 503 and error_of(await resp.json())["code"] == "not_active"

        async def ready() -> bool:
            async with http.get(sidecar.url + "/tidegate/ready") as resp:
                return resp.status == 200

        await until(ready)
        async with http.get(sidecar.url + "/tidegate/stats") as resp:
            stats = await resp.json()
        assert (stats["token_budget"], stats["max_concurrency"]) == (FALLBACK_TOKEN_BUDGET, FALLBACK_MAX_CONCURRENCY)
        assert stats["token_budget_source"] == "fallback"
        assert any("fallback" in w for w in stats["config_warnings"])
        async with http.get(sidecar.url + "/metrics") as resp:
            assert 'tidegate_admission_budget_fallback{pool="test"} 1.0' in await resp.text()
        async with post(http, sidecar.url) as resp:
            assert resp.status == 200
    fallbacks = [r for r in caplog.records if r.levelno == logging.WARNING and "fallback" in r.getMessage()]
    assert len(fallbacks) == 1


async def test_a_request_arriving_just_before_the_first_read_waits_for_it(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url, admission=AUTO)
    # sent at once, before or while the first telemetry read completes: held for it, then admitted
    async with post(http, sidecar.url) as resp:
        assert resp.status == 200


async def test_the_generic_openai_engine_falls_back_at_once(start_sidecar, http) -> None:
    async with fake_upstream({"/v1/chat/completions": _ok}) as upstream:
        sidecar = await start_sidecar(upstream, admission=AUTO, model={"engine": "openai"})
        async with http.get(sidecar.url + "/tidegate/ready") as resp:
            assert resp.status == 200 and (await resp.json())["token_budget_source"] == "fallback"
        async with post(http, sidecar.url) as resp:
            assert resp.status == 200
