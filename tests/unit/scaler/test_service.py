"""The scaler service: one scrape shared by calls within the refresh interval, pools routed to their source."""

import pytest

from tests.unit.scaler.helpers import obs
from tidegate.scaler import metadata
from tidegate.scaler.errors import SourceError
from tidegate.scaler.law import Observation
from tidegate.scaler.service import BySource, Scaler


class CountingSource:
    def __init__(self, observation: Observation) -> None:
        self.observation, self.calls, self.closed = observation, 0, False

    async def observe(self, target: metadata.Target) -> Observation:
        self.calls += 1
        return self.observation

    async def close(self) -> None:
        self.closed = True


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_get_metrics_then_is_active_share_one_scrape() -> None:
    source, clock = CountingSource(obs(active=3)), Clock()
    scaler = Scaler(source, min_refresh_s=5.0, clock=clock)
    target = metadata.parse("p", "ns", {"pool": "p"})
    first = await scaler.decide(target)
    second = await scaler.decide(target)
    assert source.calls == 1 and first is second
    clock.now = 5.0
    await scaler.decide(target)
    assert source.calls == 2


async def test_pools_go_to_the_source_they_name_and_unknown_sources_fail_clearly() -> None:
    sidecar, prom = CountingSource(obs()), CountingSource(obs())
    routed = BySource({"sidecar": sidecar})
    await routed.observe(metadata.parse("p", "ns", {"pool": "p"}))
    assert sidecar.calls == 1
    target = metadata.parse("p", "ns", {"pool": "p", "source": "prometheus", "prometheusUrl": "http://prom:9090"})
    with pytest.raises(SourceError, match="'prometheus' is not enabled"):
        await routed.observe(target)
    routed = BySource({"sidecar": sidecar, "prometheus": prom})
    await routed.observe(target)
    assert prom.calls == 1
    await routed.close()
    assert sidecar.closed and prom.closed
