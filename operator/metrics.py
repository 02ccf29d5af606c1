"""The operator's Prometheus metrics: each pool's conditions as a gauge, so an alert can read them.

``tidegate_pool_condition{namespace, pool, type, status}`` is 1 for the status a condition has now
and 0 for the other two of ``True``, ``False``, ``Unknown``, the form kube-state-metrics uses for
built-in objects (``kube_pod_status_condition``), so ``{type="Degraded", status="True"} == 1`` is
"Degraded now" and a pool never reconciled has no series at all. ``reason`` is not a label: it
changes with the cause, and an alert's ``for`` would restart with it; ``kubectl describe tgpool``
has it. Served on ``TIDEGATE_METRICS_PORT`` (``/metrics``) by :mod:`tidegate.operator.handlers`.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

STATUSES = ("True", "False", "Unknown")


class PoolConditions:
    """The pools' condition gauges; ``registry`` is private unless given."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.gauge = Gauge(
            "tidegate_pool_condition",
            "1 for the status (True, False, Unknown) an InferencePool's condition has now, 0 for the others.",
            ["namespace", "pool", "type", "status"],
            registry=self.registry,
        )
        self._types: dict[tuple[str, str], set[str]] = {}

    def observe(self, namespace: str, pool: str, conditions: Iterable[Mapping[str, Any]]) -> None:
        """Export the pool's ``status.conditions`` as written; types it no longer has are dropped."""
        now = {c["type"]: c.get("status", "Unknown") for c in conditions if c.get("type")}
        key = (namespace, pool)
        for gone in self._types.get(key, set()) - set(now):
            self._remove(namespace, pool, gone)
        for ctype, current in now.items():
            current = current if current in STATUSES else "Unknown"
            for status in STATUSES:
                self.gauge.labels(namespace, pool, ctype, status).set(1 if status == current else 0)
        self._types[key] = set(now)

    def forget(self, namespace: str, pool: str) -> None:
        """A deleted pool: no series left behind (an alert on it would never resolve)."""
        for ctype in self._types.pop((namespace, pool), set()):
            self._remove(namespace, pool, ctype)

    def _remove(self, namespace: str, pool: str, ctype: str) -> None:
        for status in STATUSES:
            self.gauge.remove(namespace, pool, ctype, status)
