"""Fixtures shared by the component tier: sim-backends on random loopback ports and an HTTP client."""

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from tidegate.sim.replica import ReplicaConfig
from tidegate.sim.server import SimBackend, SimSettings

FAST_PREFILL = 1_000_000.0


@pytest.fixture
async def start_sim() -> AsyncIterator[Callable[..., Awaitable[SimBackend]]]:
    """``await start_sim(decode_tokens_per_s=20, time_scale=1, ...)``: replica fields or SimSettings fields."""
    servers: list[SimBackend] = []
    replica_fields = set(ReplicaConfig.__dataclass_fields__)

    async def _start(**kw: object) -> SimBackend:
        kw.setdefault("prefill_tokens_per_s", FAST_PREFILL)
        replica = ReplicaConfig(**{k: v for k, v in kw.items() if k in replica_fields})
        settings = SimSettings(replica=replica, **{k: v for k, v in kw.items() if k not in replica_fields})
        sim = SimBackend(settings)
        await sim.start("127.0.0.1", 0)
        servers.append(sim)
        return sim

    yield _start
    for sim in servers:
        await sim.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session
