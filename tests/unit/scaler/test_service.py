"""The scaler service: one scrape shared by calls within the refresh interval, pools routed to their source."""

import json
import logging

import pytest

from tests.unit.scaler.helpers import obs
from tidegate.scaler import metadata, service
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


def _info_decisions(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == "tidegate.scaler" and r.levelno == logging.INFO and "scaling_decision" in r.getMessage()
    ]


async def test_a_steady_pool_logs_its_decision_at_info_when_it_changes_and_every_ten_minutes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Seen on the local cluster: KEDA's polls made ~4 identical INFO lines a minute per pool.
    caplog.set_level(logging.DEBUG, logger="tidegate.scaler")
    source, clock = CountingSource(obs(active=3)), Clock()
    scaler = Scaler(source, min_refresh_s=5.0, clock=clock)
    target = metadata.parse("p", "ns", {"pool": "p"})
    decisions = []
    for _ in range(12):  # one minute of polls, nothing changing
        decisions.append(await scaler.decide(target))
        clock.now += 5.0
    assert len({(d.desired, d.reason) for d in decisions}) == 1
    assert len(_info_decisions(caplog)) == 1  # was 12
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG and "scaling_decision" in r.getMessage()]
    assert len(debug) == 11  # still there with --log-level debug

    while clock.now <= service.LOG_HEARTBEAT_S:  # ten minutes of the same: one heartbeat at 600 s
        decisions.append(await scaler.decide(target))
        clock.now += 5.0
    assert len({(d.desired, d.reason) for d in decisions}) == 1
    assert len(_info_decisions(caplog)) == 2

    caplog.clear()
    source.observation = obs(active=3, capacity=50.0, util=1.0)  # demand: the count changes
    moved = await scaler.decide(target)
    assert moved.desired != decisions[-1].desired
    assert [(d["desired"], d["reason"]) for d in _info_decisions(caplog)] == [(moved.desired, moved.reason.value)]


def test_the_log_level_follows_the_desired_count_and_the_reason() -> None:
    assert service.log_level(None, float("-inf"), 3, "steady", 0.0) == logging.INFO
    assert service.log_level((3, "steady"), 0.0, 3, "steady", 599.0) == logging.DEBUG
    assert service.log_level((3, "steady"), 0.0, 4, "steady", 5.0) == logging.INFO
    assert service.log_level((3, "steady"), 0.0, 3, "cooldown", 5.0) == logging.INFO
    assert service.log_level((3, "steady"), 0.0, 3, "steady", 600.0) == logging.INFO
