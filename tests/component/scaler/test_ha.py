"""Two scaler replicas behind one Service: KEDA's calls alternate between them, and one joins late.

They must agree while the pool is overloaded, and a replica that joined late may only be *more*
conservative about scaling down, never less (see ``tidegate.scaler.service``).
"""

from collections.abc import AsyncIterator

import pytest

from tests.component.scaler.conftest import BUDGET, NAMESPACE, POOL, Clock, Pod
from tidegate.admission.stats import FakeSidecar, StatsSnapshot
from tidegate.scaler import metadata
from tidegate.scaler.law import Reason
from tidegate.scaler.pods import PodInfo, StaticPodSource
from tidegate.scaler.service import Scaler
from tidegate.scaler.sidecar import SidecarSignals

TARGET = metadata.parse(POOL, NAMESPACE, {"pool": POOL, "maxReplicas": "20", "scaleDownCooldownSeconds": "60"})


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[Clock, list[Pod], Scaler, Scaler]]:
    clock = Clock()
    fakes = [FakeSidecar(StatsSnapshot(instance_id="x", started_at_s=0, time_s=0)) for _ in range(4)]
    for f in fakes:
        await f.__aenter__()
    pods = [Pod(f"{POOL}-{i}", f) for i, f in enumerate(fakes)]
    for p in pods:
        p.publish(clock.now)
    infos = [PodInfo(p.name, p.fake.url) for p in pods]

    def scaler() -> Scaler:
        source = StaticPodSource({(NAMESPACE, POOL): infos})
        return Scaler(SidecarSignals(source, wall=clock), min_refresh_s=0.0, clock=clock)

    a, b = scaler(), scaler()
    try:
        yield clock, pods, a, b
    finally:
        for s in (a, b):
            await s.close()
        for f in fakes:
            await f.__aexit__(None, None, None)


def _tick(clock: Clock, pods: list[Pod], admitted: int, refused: int, util: float) -> None:
    clock.now += 15
    for p in pods:
        p.in_flight_tokens = int(util * BUDGET)
        p.serve("t0", admitted=admitted // 2, capacity=refused // 2)
        p.serve("t1", admitted=admitted - admitted // 2, capacity=refused - refused // 2)
        p.publish(clock.now)


async def test_alternating_calls_agree_under_overload(replicas) -> None:
    clock, pods, a, b = replicas
    await a.decide(TARGET)
    await b.decide(TARGET)
    answers = []
    for i in range(8):
        _tick(clock, pods, admitted=300, refused=100, util=1.0)
        answers.append((await (a if i % 2 == 0 else b).decide(TARGET)).desired)
    assert answers == [answers[0]] * 8 and answers[0] > 4


async def test_a_late_replica_never_scales_down_before_the_one_that_watched(replicas) -> None:
    clock, pods, a, b = replicas
    await a.decide(TARGET)
    a_desired, b_desired = [], []
    for i in range(12):  # three minutes of a quiet pool; b gets its first call after one minute
        _tick(clock, pods, admitted=20, refused=0, util=0.2)
        a_desired.append((await a.decide(TARGET)).desired)
        if i >= 4:
            d = await b.decide(TARGET)
            b_desired.append(d.desired)
            assert d.desired >= a_desired[-1], d.text
    assert a_desired[-1] < 4  # the watching replica did scale down after its cooldown
    assert b_desired[0] == 4  # the late one held at first
    assert (await b.decide(TARGET)).reason in (Reason.SCALE_DOWN, Reason.COOLDOWN)
