"""Fixtures: a sim-backend and a real sidecar in front of it, both on random loopback ports."""

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from tidegate.admission.config import ConfigWatcher, SidecarConfig, SidecarSettings
from tidegate.admission.engine import EngineTuning
from tidegate.admission.sidecar import Sidecar
from tidegate.sim.replica import ReplicaConfig
from tidegate.sim.server import SimBackend, SimSettings

from .helpers import MODEL


@pytest.fixture
async def start_sim() -> AsyncIterator[Callable[..., Awaitable[SimBackend]]]:
    """``await start_sim(decode_tokens_per_s=20, ...)``: ReplicaConfig or SimSettings fields."""
    servers: list[SimBackend] = []
    replica_fields = set(ReplicaConfig.__dataclass_fields__)

    async def _start(**kw: Any) -> SimBackend:
        kw.setdefault("prefill_tokens_per_s", 1_000_000.0)
        replica = ReplicaConfig(**{k: v for k, v in kw.items() if k in replica_fields})
        sim = SimBackend(SimSettings(replica=replica, **{k: v for k, v in kw.items() if k not in replica_fields}))
        await sim.start("127.0.0.1", 0)
        servers.append(sim)
        return sim

    yield _start
    for sim in servers:
        await sim.stop()


@pytest.fixture
async def start_sidecar() -> AsyncIterator[Callable[..., Awaitable[Sidecar]]]:
    """``await start_sidecar(upstream_url, admission={...}, tuning=EngineTuning(...), **settings)``."""
    sidecars: list[Sidecar] = []

    async def _start(
        upstream: str,
        admission: dict[str, Any] | None = None,
        model: dict[str, Any] | None = None,
        tuning: EngineTuning | None = None,
        **settings: Any,
    ) -> Sidecar:
        watcher = None
        if "config_path" in settings:  # a real file, watched and reloaded
            watcher = ConfigWatcher(settings["config_path"])
            config = watcher.config
        else:
            config = SidecarConfig.model_validate(
                {"pool": "test", "model": {"name": MODEL, "maxContextTokens": 32768, **(model or {})},
                 "admission": {"telemetry": {"pollIntervalMs": 50}, **(admission or {})}}
            )  # fmt: skip
            settings["config_path"] = "unused.yaml"
        sidecar = Sidecar(
            SidecarSettings(upstream=upstream, tick_s=0.02, **settings), config, tuning=tuning, watcher=watcher
        )
        await sidecar.start("127.0.0.1", 0)
        sidecars.append(sidecar)
        return sidecar

    yield _start
    for sidecar in sidecars:
        await sidecar.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session
