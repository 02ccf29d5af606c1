"""Builders shared by the scaler's unit tests, and a model of the HPA's replica calculation."""

import math

from tidegate.scaler.law import Observation


def obs(
    active: int = 4,
    admitted: float = 100.0,
    capacity: float = 0.0,
    policy: float = 0.0,
    util: float = 0.75,
    budget: int = 10_000,
    **kw: object,
) -> Observation:
    """An observation of ``active`` ready replicas, all reporting over a 60 s window.

    ``admitted``/``capacity``/``policy`` are per-second rates summed over the pool; ``util`` is the
    in-flight token utilisation of the pool (0..1+); ``budget`` is each replica's token budget.
    """
    fields: dict[str, object] = {
        "active": active,
        "reporting": active,
        "fresh": active,
        "window_s": 60.0,
        "admitted_per_s": admitted,
        "capacity_rejected_per_s": capacity,
        "policy_rejected_per_s": policy,
        "capacity_rejected_tenants": 5 if capacity else 0,
        "in_flight_tokens": round(util * active * budget),
        "token_budget": active * budget,
    }
    fields.update(kw)
    return Observation(**fields)  # type: ignore[arg-type]


def hpa_replicas(current: int, metric: float, lo: int, hi: int, tolerance: float = 0.1) -> int:
    """What the HPA does with an External AverageValue metric of target 1 (Kubernetes
    ``pkg/controller/podautoscaler/replica_calculator.go``: GetExternalPerPodMetricReplicas, with
    ``tolerances.isWithin`` = ``1 - down <= ratio <= 1 + up``; values in milli-units)."""
    usage_milli = math.ceil(metric * 1000)  # resource.Quantity.MilliValue rounds up
    usage_ratio = usage_milli / (1000 * current)
    if (1.0 - tolerance) <= usage_ratio <= (1.0 + tolerance):  # tolerances.isWithin
        return current
    return max(lo, min(hi, math.ceil(usage_milli / 1000)))
