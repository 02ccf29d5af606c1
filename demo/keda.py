"""Stands in for KEDA and the HPA: calls the real scaler over gRPC and writes the pool's replicas.

As KEDA does with an ``external`` trigger (KEDA 2.17 ``pkg/scalers/external_scaler.go``):
``GetMetricSpec`` once when the HPA is built (the metric name and its ``AverageValue`` target),
then every ``pollingInterval`` ``GetMetrics`` followed by ``IsActive``, each with the trigger's
metadata as ``scalerMetadata``. The metric goes through the HPA's algorithm (:class:`tidegate.sim.simulate.hpa.Hpa`: 10%
tolerance, the behaviour of :func:`behavior`; ``currentReplicas`` is the scale's ``spec.replicas``, as
in the HPA controller), and a changed count is written to the pool's ``spec.replicas``.
IsActive only matters for 0 <-> 1, which the demo never does (``minReplicas`` >= 1); it is called
and recorded anyway, as KEDA would. Each write is recorded with the decision behind its metric
(IsActive decides afresh) and, when the HPA wrote other than the metric asked, why
(:func:`hpa_note`: a behaviour policy, the stabilisation window, min/maxReplicas).
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
    ``maxScaleUpStep`` pods per polling interval, no up stabilisation; a scale-down window), compressed
    to the demo's time: the window is the demo's cooldown instead of the operator's 60 s, and one pod
    goes per polling interval instead of per 60 s."""
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


def hpa_note(
    s: scenario.DemoSettings,
    events: list[ScaleEvent],
    asked_history: list[tuple[float, int]],
    now_s: float,
    before: int,
    after: int,
    asked: int,
) -> str:
    """Why the HPA wrote ``after`` replicas and not the ``asked`` the scaler's metric recommends
    (``ceil(metric / target)``); empty when it wrote what was asked.

    ``events``: the earlier writes; ``asked_history``: ``(time_s, asked)`` of every sync, this one
    included. Mirrors :class:`tidegate.sim.simulate.hpa.Hpa` under :func:`behavior` (Kubernetes
    "Configurable scaling behavior": a policy bounds the change over its ``periodSeconds``; scale-down
    goes no lower than the highest recommendation of its stabilisation window). Pure.
    """
    if after == asked:
        return ""
    rules = behavior(s)
    up = asked > after
    if up and after >= s.max_replicas:
        return f"HPA: held at maxReplicas {s.max_replicas} (the scaler asked {asked})"
    if not up and after <= s.replicas:
        return f"HPA: held at minReplicas {s.replicas} (the scaler asked {asked})"
    why = []
    if not up:
        window = rules["scaleDown"]["stabilizationWindowSeconds"]
        highest = max((a for t, a in asked_history if t > now_s - window), default=asked)
        if after == highest:
            why.append(f"scale-down stabilisation: {highest} was asked within the last {window:g} s")
    policy = rules["scaleUp" if up else "scaleDown"]["policies"][0]
    period, step = policy["periodSeconds"], policy["value"]
    # As the HPA does: the policy bounds the change from the count at the start of its period.
    moved = sum(abs(e.after - e.before) for e in events if (e.after > e.before) == up and e.t_s > now_s - period)
    if after == (before - moved + step if up else before + moved - step):
        why.append(
            f"{'scaleUp' if up else 'scaleDown'} policy: at most {step} pod(s) per {period:g} s"
            + (f", {moved} {'added' if up else 'removed'} in the last {period:g} s" if moved else "")
        )
    return f"HPA {' and '.join(why) or f'wrote {after}'} (the scaler asked {asked})"


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
        self._asked: list[tuple[float, int]] = []  # (time_s, the metric's recommendation), for hpa_note

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
            text = self.decision_text()  # the decision behind this metric; IsActive decides afresh
            self.active = (await self.stub.IsActive(self.ref, timeout=5.0)).result
        except grpc.aio.AioRpcError as exc:  # KEDA keeps the current count (and counts toward fallback)
            log.warning("scaler call failed: %s %s", exc.code(), exc.details())
            return
        value = answer.metricValues[0]
        self.metric = value.metricValueFloat if value.metricValueFloat > 0 else float(value.metricValue)
        now = self.clock()
        current = self.pool.spec_replicas  # the HPA's currentReplicas is the scale's spec.replicas
        asked = self.hpa.recommend(self.metric, self.target, MetricType.AVERAGE_VALUE, current)
        self._asked = [(t, a) for t, a in self._asked if t > now - self.s.cooldown_s] + [(now, asked)]
        desired = self.hpa.sync(now, self.metric, self.target, MetricType.AVERAGE_VALUE, current)
        self.timeline.last_decision = text
        if desired != current:
            note = hpa_note(self.s, self.timeline.scale_events, self._asked, now, current, desired, asked)
            self.timeline.scale_events.append(ScaleEvent(now, current, desired, text, note))
            self.pool.scale(desired)

    async def close(self) -> None:
        await self.channel.close()
