"""A real scaler (gRPC over 127.0.0.1) reading real HTTP stats servers (FakeSidecar) over loopback.

Time is the test's: every snapshot carries ``time_s`` from :class:`Clock`, and the scaler reads the
same clock (wall and monotonic), so "15 s later" needs no sleeping.
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import pytest

from tidegate.admission.reasons import Reason
from tidegate.admission.stats import FakeSidecar, StatsSnapshot, TenantCounters
from tidegate.scaler import server
from tidegate.scaler.metrics import DesiredReplicasMetric
from tidegate.scaler.pods import PodInfo, StaticPodSource
from tidegate.scaler.proto import externalscaler_pb2 as pb
from tidegate.scaler.proto import externalscaler_pb2_grpc as pb_grpc
from tidegate.scaler.service import Scaler
from tidegate.scaler.sidecar import SidecarSignals

NAMESPACE, POOL = "team-a", "small"
BUDGET = 10_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_764_480_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Pod:
    """One simulated replica: its counters, advanced by the test, served by a FakeSidecar."""

    name: str
    fake: FakeSidecar
    admitted: int = 0
    rejected: dict[Reason, int] = field(default_factory=dict)
    tenants: dict[str, TenantCounters] = field(default_factory=dict)
    in_flight_tokens: int = 0

    def publish(self, now: float) -> None:
        self.fake.snapshot = StatsSnapshot(
            pool=POOL,
            pod=self.name,
            instance_id=f"{self.name}-1",
            started_at_s=now - 3600,
            time_s=now,
            admitted_total=self.admitted,
            rejected_total=dict(self.rejected),
            tenants={k: v.model_copy() for k, v in self.tenants.items()},
            in_flight_tokens=self.in_flight_tokens,
            token_budget=BUDGET,
        )

    def serve(self, tenant: str, admitted: int = 0, capacity: int = 0, policy: int = 0) -> None:
        """``tenant`` had ``admitted`` requests admitted, ``capacity`` refused for capacity (queue
        full) and ``policy`` refused by policy (tenant rate) since the last publish."""
        self.admitted += admitted
        if capacity:
            self.rejected[Reason.QUEUE_FULL] = self.rejected.get(Reason.QUEUE_FULL, 0) + capacity
        if policy:
            self.rejected[Reason.TENANT_RATE] = self.rejected.get(Reason.TENANT_RATE, 0) + policy
        t = self.tenants.setdefault(tenant, TenantCounters())
        t.admitted += admitted
        t.capacity_rejected += capacity
        t.policy_rejected += policy


@dataclass
class Rig:
    clock: Clock
    pods: list[Pod]
    source: StaticPodSource
    stub: pb_grpc.ExternalScalerStub
    channel: grpc.aio.Channel
    metric: DesiredReplicasMetric

    def tick(self, seconds: float = 15.0) -> None:
        """Advance time and publish every pod's counters."""
        self.clock.now += seconds
        for p in self.pods:
            p.publish(self.clock.now)

    def ref(self, **metadata: str) -> pb.ScaledObjectRef:
        md = {"pool": POOL, "scalerAddress": "127.0.0.1", "maxReplicas": "20", "scaleDownCooldownSeconds": "300"}
        md.update(metadata)
        return pb.ScaledObjectRef(name=POOL, namespace=NAMESPACE, scalerMetadata=md)

    async def desired(self, **metadata: str) -> float:
        resp = await self.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=self.ref(**metadata)))
        (value,) = resp.metricValues
        assert value.metricValue == round(value.metricValueFloat)  # both fields always set
        return value.metricValueFloat


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    clock = Clock()
    fakes = [FakeSidecar(StatsSnapshot(instance_id="x", started_at_s=0, time_s=0)) for _ in range(4)]
    for f in fakes:
        await f.__aenter__()
    pods = [Pod(f"{POOL}-{i}", f) for i, f in enumerate(fakes)]
    for p in pods:
        p.in_flight_tokens = int(0.75 * BUDGET)
        p.publish(clock.now)
    source = StaticPodSource({(NAMESPACE, POOL): [PodInfo(p.name, p.fake.url) for p in pods]})
    signals = SidecarSignals(source, timeout_s=1.0, stale_after_s=30.0, wall=clock)
    metric = DesiredReplicasMetric()
    scaler = Scaler(signals, min_refresh_s=0.0, clock=clock, hooks=(metric.record,))
    grpc_server, port = await server.start(scaler, "127.0.0.1:0", stream_interval_s=0.02)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Rig(clock, pods, source, pb_grpc.ExternalScalerStub(channel), channel, metric)
    finally:
        await channel.close()
        await grpc_server.stop(grace=None)
        await scaler.close()
        for f in fakes:
            await f.__aexit__(None, None, None)
