"""The scaler's Prometheus metrics.

``tidegate_scaler_desired_replicas{namespace,pool,reason}``: the last decision per pool; exactly
one series per pool (the previous reason's series is removed when the reason changes), so
``sum by (pool)`` is the desired count and the ``reason`` label says why. ``namespace`` is added to
the issue's ``{pool,reason}`` because two namespaces may hold pools of the same name.
``tidegate_scaler_capacity_reject_rate{namespace,pool}``: capacity rejections / demand (0..1).
A pool the scaler forgets (no longer asked about by KEDA) loses its series.
"""

import contextlib

from prometheus_client import CollectorRegistry, Gauge

from tidegate.scaler.law import Decision
from tidegate.scaler.metadata import Target


class DesiredReplicasMetric:
    """Records each decision; ``registry`` is private unless given. Served by :mod:`tidegate.scaler.sideport`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.desired = Gauge(
            "tidegate_scaler_desired_replicas",
            "Active replicas the scaler asks for, by the reason of the last decision.",
            ["namespace", "pool", "reason"],
            registry=self.registry,
        )
        self.reject_rate = Gauge(
            "tidegate_scaler_capacity_reject_rate",
            "Capacity rejections / capacity demand over the window (0..1).",
            ["namespace", "pool"],
            registry=self.registry,
        )
        self._reasons: dict[tuple[str, str], str] = {}

    def record(self, target: Target, decision: Decision) -> None:
        key = (target.namespace, target.pool)
        previous = self._reasons.get(key)
        if previous is not None and previous != decision.reason.value:
            self.desired.remove(target.namespace, target.pool, previous)
        self._reasons[key] = decision.reason.value
        self.desired.labels(target.namespace, target.pool, decision.reason.value).set(decision.desired)
        if decision.capacity_reject_rate is not None:
            self.reject_rate.labels(target.namespace, target.pool).set(decision.capacity_reject_rate)

    def forget(self, key: tuple[str, str]) -> None:
        """Remove pool ``key``'s series (``(namespace, pool)``; a forgotten pool is no longer exported)."""
        reason = self._reasons.pop(key, None)
        if reason is not None:
            self.desired.remove(*key, reason)
        with contextlib.suppress(KeyError):  # prometheus-client < 0.21 raises for a label set never set
            self.reject_rate.remove(*key)
