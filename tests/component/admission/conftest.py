"""Fixtures: a real sidecar on a random loopback port (sim-backends and ``http``: tests/component/conftest.py)."""

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from tidegate.admission.config import ConfigWatcher, SidecarConfig, SidecarSettings
from tidegate.admission.engine import EngineTuning
from tidegate.admission.sidecar import Sidecar

from .helpers import MODEL

PINNED = {"tokenBudget": 65_536, "maxConcurrency": 64}
"""The numbers these tests reason about (fake upstreams report no capacity); a test of sizing from
the engine passes ``admission={"tokenBudget": None, "maxConcurrency": None}``."""


@pytest.fixture
async def start_sidecar() -> AsyncIterator[Callable[..., Awaitable[Sidecar]]]:
    """``await start_sidecar(upstream_url, admission={...}, tuning=EngineTuning(...), **settings)``
    (admission over :data:`PINNED`)."""
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
                 "admission": {**PINNED, "telemetry": {"pollIntervalMs": 50}, **(admission or {})}}
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
