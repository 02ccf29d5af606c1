"""Status of an InferencePool from what the operator observed (pure).

Conditions follow ``metav1.Condition``: ``lastTransitionTime`` changes only when ``status``
does, so ``kubectl describe`` tells how long a pool has been Ready or Degraded.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from tidegate.api.status import ConditionType
from tidegate.operator.warm_pool import Plan


class Integration(StrEnum):
    """State of an optional integration (KEDA, Karpenter)."""

    APPLIED = "Applied"
    DISABLED = "Disabled"
    CRD_MISSING = "CRDMissing"
    SCALER_UNREACHABLE = "ScalerUnreachable"
    FAILED = "Failed"
    NOT_RECONCILED = "NotReconciled"  # written, but its controller has not acted on it
    NOT_READY = "NotReady"  # its controller reports it not Ready


@dataclass(frozen=True)
class Observed:
    """What one reconcile saw and did, input to :func:`status`."""

    generation: int
    desired_active: int
    warm_size: int
    plan: Plan
    selector: str
    keda: Integration
    keda_message: str
    node_pool: Integration
    node_pool_message: str
    scaler_reachable: bool | None  # None: not checked (KEDA disabled or absent)
    degraded_reasons: tuple[str, ...] = ()  # the problems' messages
    degraded_reason: str = ""  # Degraded's reason: the first problem's (failures.Reason)
    scaler_address: str = ""
    fallback_replicas: int | None = None  # spec.scaling.fallbackReplicas
    keda_says: str | None = None  # KEDA's reason and message when it reports the ScaledObject not Ready
    notes: tuple[str, ...] = ()  # said in Ready's message, e.g. spec.replicas held at scaling.minReplicas


def scaler_unreachable(observed: Observed) -> tuple[str, str]:
    """(reason, message) of ``ScalerReachable=False``: what KEDA will and will not do meanwhile.

    With the scaler process down, KEDA's metrics adapter fails on ``GetMetricSpec`` before it
    counts a ``GetMetrics`` failure, so the failure count stays 0, ``fallback`` never starts and
    the HPA, with no metric, keeps the current replica count (KEDA issue #8056, reproduced on
    KEDA v2.21.0 with the real HPA controller).
    """
    where = f"the tidegate scaler at {observed.scaler_address or '?'} does not answer its gRPC health check"
    if observed.keda is Integration.SCALER_UNREACHABLE:
        return "HealthCheckFailed", f"{where}: no ScaledObject is created until it does, so nothing scales this pool"
    n = observed.desired_active
    message = (
        f"{where}: KEDA cannot read the pool's metric, so it holds the pool at its current {n} replica(s) "
        "(no scale-up under load, no scale-down when idle) until the scaler answers"
    )
    if observed.fallback_replicas is not None:
        message += (
            f"; KEDA will not move to scaling.fallbackReplicas ({observed.fallback_replicas}): with the scaler "
            "down its GetMetricSpec call fails before any failure is counted (KEDA issue #8056)"
        )
    else:
        message += "; KEDA's fallback would not start either (KEDA issue #8056): run 2+ scaler replicas"
    if observed.keda_says:
        message += f". KEDA reports: {observed.keda_says}"
    return "KedaHoldsReplicas", message


def _condition(
    ctype: str, ok: bool, reason: str, message: str, generation: int, old: Mapping[str, Mapping[str, Any]], now: str
) -> dict[str, Any]:
    status = "True" if ok else "False"
    previous = old.get(ctype)
    since = previous["lastTransitionTime"] if previous and previous.get("status") == status else now
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }


def status(
    observed: Observed, old_conditions: Iterable[Mapping[str, Any]], now: datetime | None = None
) -> dict[str, Any]:
    """The ``status`` patch (camelCase) for one reconcile; keeps transition times of unchanged conditions."""
    now_s = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = {c["type"]: c for c in old_conditions if "type" in c}
    p = observed.plan
    gen = observed.generation
    serving = p.ready_active >= observed.desired_active
    warm_full = p.warm_ready >= observed.warm_size
    converged = p.empty and serving and warm_full and p.draining == 0
    summary = f"{p.ready_active}/{observed.desired_active} active ready, {p.warm_ready}/{observed.warm_size} warm ready"
    if p.draining:
        summary += f", {p.draining} draining"
    if observed.notes:
        summary += f" ({'; '.join(observed.notes)})"
    conditions = [
        _condition(
            ConditionType.READY, serving, "Serving" if serving else "WaitingForReplicas", summary, gen, old, now_s
        ),
        _condition(
            ConditionType.PROGRESSING,
            not converged,
            "Reconciling" if not converged else "Converged",
            summary if not converged else "all replicas in place",
            gen,
            old,
            now_s,
        ),
        _condition(
            ConditionType.DEGRADED,
            bool(observed.degraded_reasons),
            (observed.degraded_reason or "Degraded") if observed.degraded_reasons else "AsExpected",
            "; ".join(observed.degraded_reasons) or "no problem seen",
            gen,
            old,
            now_s,
        ),
        _condition(
            ConditionType.KEDA_READY,
            observed.keda is Integration.APPLIED,
            observed.keda.value,
            observed.keda_message,
            gen,
            old,
            now_s,
        ),
        _condition(
            ConditionType.NODE_POOL_READY,
            observed.node_pool in (Integration.APPLIED, Integration.DISABLED),
            observed.node_pool.value,
            observed.node_pool_message,
            gen,
            old,
            now_s,
        ),
    ]
    if observed.scaler_reachable is not None:
        reason, message = (
            (
                "HealthCheckServing",
                f"the tidegate scaler at {observed.scaler_address or '?'} answers gRPC health checks",
            )
            if observed.scaler_reachable
            else scaler_unreachable(observed)
        )
        conditions.append(
            _condition(ConditionType.SCALER_REACHABLE, observed.scaler_reachable, reason, message, gen, old, now_s)
        )
    return {
        "observedGeneration": gen,
        "replicas": p.active,
        "readyReplicas": p.ready_active,
        "warmReplicas": p.warm_ready,
        "selector": observed.selector,
        "conditions": conditions,
    }
