"""The Horizontal Pod Autoscaler's algorithm, as KEDA drives it, for one scale target.

Every policy's metric goes through this same controller, so differences between policies come
from their signals, not from how the HPA treats them. Source: Kubernetes HPA docs, "Algorithm
details" and "Configurable scaling behavior" (kubernetes.io/docs/tasks/run-application/
horizontal-pod-autoscale/), ``pkg/controller/podautoscaler/horizontal.go``:

- ``AverageValue`` target ``v`` of a metric ``m`` (KEDA's external and Prometheus triggers):
  ratio ``= m / (v x current)``; recommendation ``ceil(m / v)``;
- ``Utilization`` target ``u`` of a per-pod average ``a`` (resource metrics, e.g. GPU util via
  prometheus-adapter): ratio ``= a / u``; recommendation ``ceil(current x a / u)``;
- no change while ``|ratio - 1| <= tolerance`` (``--horizontal-pod-autoscaler-tolerance``, 0.1);
- stabilisation: up to the *lowest* recommendation of the last ``scale_up_window_s`` (default
  0 s), down to the *highest* of the last ``scale_down_window_s`` (default 300 s);
- rate limits (default behaviour): up by at most ``max(4 pods, 100%)`` per 15 s period, down by
  at most 100% per 15 s; then ``[min_replicas, max_replicas]``.

KEDA's ``cooldownPeriod`` only governs 1 <-> 0 and is not modelled (scenarios keep >= 1 replica).
Pure: time is passed in.
"""

import dataclasses
import math
from enum import StrEnum


class MetricType(StrEnum):
    AVERAGE_VALUE = "AverageValue"
    UTILIZATION = "Utilization"


@dataclasses.dataclass
class Hpa:
    """One HPA. Call :meth:`sync` every sync period with the metric; it returns the new spec.replicas."""

    min_replicas: int
    max_replicas: int
    tolerance: float = 0.1
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    period_s: float = 15.0
    up_pods: int = 4
    up_percent: float = 100.0
    _recs: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    _events: list[tuple[float, int]] = dataclasses.field(default_factory=list)  # (time, replicas after)

    def seed(self, now_s: float, replicas: int) -> None:
        """Start with ``replicas`` recommended at ``now_s`` (an HPA that has been running steadily)."""
        self._recs = [(now_s, replicas)]

    def recommend(self, metric: float, target: float, kind: MetricType, current: int) -> int:
        """The raw recommendation for one metric reading (before stabilisation and limits)."""
        if current <= 0:
            return max(1, math.ceil(metric / target)) if kind is MetricType.AVERAGE_VALUE else 1
        ratio = metric / (target * current) if kind is MetricType.AVERAGE_VALUE else metric / target
        if abs(ratio - 1.0) <= self.tolerance:
            return current
        if kind is MetricType.AVERAGE_VALUE:
            return math.ceil(metric / target - 1e-9)
        return math.ceil(current * ratio - 1e-9)

    def sync(self, now_s: float, metric: float, target: float, kind: MetricType, current: int) -> int:
        """One HPA sync at ``now_s``; ``current`` is the scale subresource's status.replicas."""
        rec = self.recommend(metric, target, kind, current)
        self._recs = [
            (t, r) for t, r in self._recs if t > now_s - max(self.scale_down_window_s, self.scale_up_window_s)
        ]
        self._recs.append((now_s, rec))
        up_recs = [r for t, r in self._recs if t > now_s - self.scale_up_window_s] or [rec]
        down_recs = [r for t, r in self._recs if t > now_s - self.scale_down_window_s] or [rec]
        up_rec, down_rec = min(up_recs), max(down_recs)
        desired = current
        if current < up_rec:
            desired = up_rec
        elif current > down_rec:
            desired = down_rec
        if desired > current:
            base = self._replicas_period_ago(now_s, current)
            limit = max(base + self.up_pods, math.floor(base * (1 + self.up_percent / 100.0)))
            desired = min(desired, limit)
        desired = max(self.min_replicas, min(self.max_replicas, desired))
        if desired != current:
            self._events.append((now_s, desired))
        return desired

    def _replicas_period_ago(self, now_s: float, current: int) -> int:
        """Replicas at the start of the rate-limit period (the HPA's scale-event history)."""
        earlier = [r for t, r in self._events if t > now_s - self.period_s]
        return min([current, *earlier]) if earlier else current
