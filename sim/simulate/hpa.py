"""The Horizontal Pod Autoscaler's algorithm, as KEDA drives it, for one scale target.

Every policy's metric goes through this same controller, so differences between policies come
from their signals and their ``behavior``, not from how the HPA is modelled. Source: Kubernetes HPA
docs, "Algorithm details" and "Configurable scaling behavior" (kubernetes.io/docs/tasks/
run-application/horizontal-pod-autoscale/), ``pkg/controller/podautoscaler/horizontal.go``:

- current replicas are the scale subresource's ``spec.replicas``;
- ``AverageValue`` target ``v`` of a metric ``m`` (KEDA's external and Prometheus triggers):
  ratio ``= m / (v x current)``; recommendation ``ceil(m / v)``;
- ``Utilization`` target ``u`` of a per-pod average ``a`` (resource metrics, e.g. GPU util via
  prometheus-adapter): ratio ``= a / u``; recommendation ``ceil(current x a / u)``;
- no change while ``|ratio - 1| <= tolerance`` (``--horizontal-pod-autoscaler-tolerance``, 0.1);
- stabilisation: up to the *lowest* recommendation of the last ``scaleUp.stabilizationWindowSeconds``,
  down to the *highest* of the last ``scaleDown.stabilizationWindowSeconds``;
- rate limits: each policy (``Pods`` or ``Percent`` per ``periodSeconds``) bounds the change from the
  replica count at the start of its period; ``selectPolicy`` ``Max`` takes the policy allowing the
  largest change, ``Min`` the smallest; then ``[min_replicas, max_replicas]``.

:data:`DEFAULT_BEHAVIOR` is the HPA's default ``behavior``. KEDA's ``cooldownPeriod`` only governs
1 <-> 0 and is not modelled (scenarios keep >= 1 replica). Pure: time is passed in.
"""

import dataclasses
import math
from enum import StrEnum
from typing import Any


class MetricType(StrEnum):
    AVERAGE_VALUE = "AverageValue"
    UTILIZATION = "Utilization"


DEFAULT_BEHAVIOR: dict[str, Any] = {
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}, {"type": "Percent", "value": 100, "periodSeconds": 15}],
    },
    "scaleDown": {
        "stabilizationWindowSeconds": 300,
        "selectPolicy": "Max",
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
    },
}  # fmt: skip


@dataclasses.dataclass
class Hpa:
    """One HPA. Call :meth:`sync` every sync period with the metric; it returns the new spec.replicas.

    ``behavior``: the HPA ``spec.behavior`` mapping (camelCase, as in a ScaledObject's
    ``advanced.horizontalPodAutoscalerConfig.behavior``); missing directions use the defaults.
    """

    min_replicas: int
    max_replicas: int
    behavior: dict[str, Any] = dataclasses.field(default_factory=lambda: DEFAULT_BEHAVIOR)
    tolerance: float = 0.1
    _recs: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    _events: list[tuple[float, int]] = dataclasses.field(default_factory=list)  # (time, change)

    def _rules(self, direction: str) -> dict[str, Any]:
        return self.behavior.get(direction) or DEFAULT_BEHAVIOR[direction]

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
        """One HPA sync at ``now_s``; ``current`` is the scale subresource's spec.replicas."""
        rec = self.recommend(metric, target, kind, current)
        up_window = self._rules("scaleUp").get("stabilizationWindowSeconds", 0)
        down_window = self._rules("scaleDown").get("stabilizationWindowSeconds", 300)
        self._recs = [(t, r) for t, r in self._recs if t > now_s - max(up_window, down_window)]
        self._recs.append((now_s, rec))
        up_rec = min([r for t, r in self._recs if t > now_s - up_window] or [rec])
        down_rec = max([r for t, r in self._recs if t > now_s - down_window] or [rec])
        desired = current
        if current < up_rec:
            desired = min(up_rec, self._limit("scaleUp", now_s, current))
        elif current > down_rec:
            desired = max(down_rec, self._limit("scaleDown", now_s, current))
        desired = max(self.min_replicas, min(self.max_replicas, desired))
        if desired != current:
            self._events.append((now_s, desired - current))
        return desired

    def _limit(self, direction: str, now_s: float, current: int) -> int:
        """The furthest ``direction`` may go from ``current`` now under its policies."""
        rules = self._rules(direction)
        up = direction == "scaleUp"
        limits = []
        for policy in rules.get("policies", []):
            changed = sum(d for t, d in self._events if t > now_s - policy["periodSeconds"] and (d > 0) == up)
            start = current - changed  # replicas at the start of the period
            if policy["type"] == "Pods":
                limits.append(start + policy["value"] if up else start - policy["value"])
            elif up:
                limits.append(math.ceil(start * (1 + policy["value"] / 100.0)))
            else:
                limits.append(math.ceil(start * (1 - policy["value"] / 100.0)))
        if not limits:
            return self.max_replicas if up else self.min_replicas
        widest = max if up else min
        narrowest = min if up else max
        return (widest if rules.get("selectPolicy", "Max") == "Max" else narrowest)(limits)
