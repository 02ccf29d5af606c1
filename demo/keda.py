"""Stands in for KEDA and the HPA: calls the real scaler over gRPC and writes the pool's replicas.

As KEDA does with an ``external`` trigger (KEDA 2.17 ``pkg/scalers/external_scaler.go``):
``GetMetricSpec`` once when the HPA is built (the metric name and its ``AverageValue`` target),
then every ``pollingInterval`` ``GetMetrics`` followed by ``IsActive``, each with the trigger's
metadata as ``scalerMetadata``. The metric goes through the HPA's algorithm (:class:`tidegate.sim.simulate.hpa.Hpa`: 10%
tolerance, the behaviour of :func:`behavior`; ``currentReplicas`` is the scale's ``spec.replicas``, as
in the HPA controller), and a changed count is written to the pool's ``spec.replicas``.
IsActive only matters for 0 <-> 1, which the demo never does (``minReplicas`` >= 1); it is called
and recorded anyway, as KEDA would.
"""

import logging
from collections.abc import Callable
from typing import Any

import grpc

from tidegate.demo import scenario
from tidegate.demo.pool import Pool
from tidegate.demo.timeline import ScaleEvent, Timeline
from tidegate.scaler.proto import externalscaler_pb2 as pb
from tidegate.scaler.proto import externalscaler_pb2_grpc as pb_grpc
from tidegate.sim.simulate.hpa import Hpa, MetricType

log = logging.getLogger(__name__)
MAX_SCALE_UP_STEP = int(scenario.SCALER_MAX_SCALE_UP_STEP)


def behavior(s: scenario.DemoSettings) -> dict[str, Any]:
    """The HPA behaviour, shaped as the operator's ScaledObject writes it (scale up by at most
    ``maxScaleUpStep`` pods per polling interval, no up stabilisation; down stabilised over the
    cooldown), with the scale-down rate compressed to the demo's time (one pod per polling interval
    instead of per 60 s)."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": MAX_SCALE_UP_STEP, "periodSeconds": s.poll_interval_s}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": s.cooldown_s,
            "selectPolicy": "Min",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": s.poll_interval_s}],
        },
    }


class KedaStandIn:
    """One ScaledObject's worth of KEDA + HPA against the scaler at ``address`` (``HOST:PORT``).

    ``decision_text``: returns the scaler's last decision text (its Event line), for the record.
    """

    def __init__(
        self,
        address: str,
        settings: scenario.DemoSettings,
        pool: Pool,
        timeline: Timeline,
        clock: Callable[[], float],
        decision_text: Callable[[], str],
    ) -> None:
        self.s = settings
        self.pool = pool
        self.timeline = timeline
        self.clock = clock
        self.decision_text = decision_text
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = pb_grpc.ExternalScalerStub(self.channel)
        self.ref = pb.ScaledObjectRef(
            name=scenario.POOL, namespace=scenario.NAMESPACE, scalerMetadata=scenario.scaler_metadata(settings)
        )
        self.hpa = Hpa(min_replicas=settings.replicas, max_replicas=settings.max_replicas, behavior=behavior(settings))
        self.metric_name = ""
        self.target = 1.0
        self.active = True
        self.metric = 0.0

    async def setup(self) -> None:
        """GetMetricSpec: the metric's name and target (the HPA is built from it)."""
        spec = (await self.stub.GetMetricSpec(self.ref, timeout=5.0)).metricSpecs[0]
        self.metric_name = spec.metricName
        self.target = spec.targetSizeFloat or float(spec.targetSize)
        self.hpa.seed(self.clock(), self.s.replicas)

    async def poll(self) -> None:
        """One polling interval: GetMetrics, IsActive, the HPA sync, and the scale write if it moved."""
        request = pb.GetMetricsRequest(scaledObjectRef=self.ref, metricName=self.metric_name)
        try:
            answer = await self.stub.GetMetrics(request, timeout=5.0)
            self.active = (await self.stub.IsActive(self.ref, timeout=5.0)).result
        except grpc.aio.AioRpcError as exc:  # KEDA keeps the current count (and counts toward fallback)
            log.warning("scaler call failed: %s %s", exc.code(), exc.details())
            return
        value = answer.metricValues[0]
        self.metric = value.metricValueFloat if value.metricValueFloat > 0 else float(value.metricValue)
        now = self.clock()
        current = self.pool.spec_replicas  # the HPA's currentReplicas is the scale's spec.replicas
        desired = self.hpa.sync(now, self.metric, self.target, MetricType.AVERAGE_VALUE, current)
        text = self.decision_text()
        self.timeline.last_decision = text
        if desired != self.pool.spec_replicas:
            self.timeline.scale_events.append(ScaleEvent(now, self.pool.spec_replicas, desired, text))
            self.pool.scale(desired)

    async def close(self) -> None:
        await self.channel.close()
