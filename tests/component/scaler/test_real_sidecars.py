"""The scaler reading real admission sidecars in front of sim-backends, over loopback.

Two replicas (``tidegate sim-backend`` + ``tidegate admission`` each, in process), each admitting
two requests at a time with no queue. The scaler's sidecar source scrapes their real
``/tidegate/stats`` and the law decides, as in production.
"""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tidegate.admission.config import SidecarConfig, SidecarSettings
from tidegate.admission.sidecar import Sidecar
from tidegate.scaler import metadata
from tidegate.scaler.law import Reason
from tidegate.scaler.pods import PodInfo, StaticPodSource
from tidegate.scaler.service import Scaler
from tidegate.scaler.sidecar import SidecarSignals
from tidegate.sim.replica import ReplicaConfig
from tidegate.sim.server import SimBackend, SimSettings

MODEL = "sim-llama-3.1-8b"
ADMISSION = {
    "maxConcurrency": 2,
    "queue": {"maxDepth": 0},
    "telemetry": {"pollIntervalMs": 50},
    "tenancy": {"identity": "header", "tenants": [{"name": "greedy", "tokensPerSecond": 50, "burstTokens": 100}]},
}


@pytest.fixture
async def pool() -> AsyncIterator[tuple[list[Sidecar], Scaler, metadata.Target]]:
    sims, sidecars = [], []
    for _ in range(2):
        sim = SimBackend(
            SimSettings(replica=ReplicaConfig(prefill_tokens_per_s=1_000_000.0, decode_tokens_per_s=100.0))
        )
        await sim.start("127.0.0.1", 0)
        sims.append(sim)
        config = SidecarConfig.model_validate(
            {"pool": "small", "model": {"name": MODEL, "maxContextTokens": 32768}, "admission": ADMISSION}
        )
        sidecar = Sidecar(SidecarSettings(config_path="unused.yaml", upstream=sim.url, tick_s=0.02), config)
        await sidecar.start("127.0.0.1", 0)
        sidecars.append(sidecar)
    source = StaticPodSource({("ns", "small"): [PodInfo(f"small-{i}", s.url) for i, s in enumerate(sidecars)]})
    scaler = Scaler(SidecarSignals(source), min_refresh_s=0.0)
    target = metadata.parse("small", "ns", {"pool": "small", "maxReplicas": "10"})
    try:
        yield sidecars, scaler, target
    finally:
        await scaler.close()
        for sidecar in sidecars:
            await sidecar.stop()
        for sim in sims:
            await sim.stop()


async def _burst(http: aiohttp.ClientSession, url: str, n: int, tenant: str, max_tokens: int) -> list[int]:
    async def one() -> int:
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
        }
        async with http.post(url + "/v1/chat/completions", json=body, headers={"x-tenant-id": tenant}) as resp:
            await resp.read()
            return resp.status

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def test_overloaded_sidecars_raise_desired(pool) -> None:
    sidecars, scaler, target = pool
    before = await scaler.decide(target)
    assert before.desired == 2
    async with aiohttp.ClientSession() as http:
        statuses = await asyncio.gather(*(_burst(http, s.url, 20, f"t{i}", 30) for i, s in enumerate(sidecars)))
    assert sum(code == 503 for codes in statuses for code in codes) >= 30  # refused for capacity
    d = await scaler.decide(target)
    assert (d.reason, d.desired) == (Reason.SATURATED, 6), d.text  # 2 + step 4
    assert d.capacity_reject_rate is not None and d.capacity_reject_rate > 0.5
    assert "across 2 tenants" in d.text


async def test_one_tenant_far_over_quota_leaves_desired_unchanged(pool) -> None:
    sidecars, scaler, target = pool
    await scaler.decide(target)
    async with aiohttp.ClientSession() as http:
        greedy = await _burst(http, sidecars[0].url, 30, "greedy", 60)
        polite = await _burst(http, sidecars[1].url, 2, "polite", 10)
    assert greedy.count(429) >= 25 and polite == [200, 200]
    d = await scaler.decide(target)
    assert d.desired == 2 and d.reason is not Reason.SATURATED, d.text
    assert d.capacity_reject_rate == 0.0
    assert d.policy_reject_rate is not None and d.policy_reject_rate > 0.5
