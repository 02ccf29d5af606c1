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
    degraded_reasons: tuple[str, ...] = ()


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
            "Degraded" if observed.degraded_reasons else "AsExpected",
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
        conditions.append(
            _condition(
                ConditionType.SCALER_REACHABLE,
                observed.scaler_reachable,
                "HealthCheckServing" if observed.scaler_reachable else "HealthCheckFailed",
                "the tidegate scaler answers gRPC health checks"
                if observed.scaler_reachable
                else "the tidegate scaler did not answer its gRPC health check",
                gen,
                old,
                now_s,
            )
        )
    return {
        "observedGeneration": gen,
        "replicas": p.active,
        "readyReplicas": p.ready_active,
        "warmReplicas": p.warm_ready,
        "selector": observed.selector,
        "conditions": conditions,
    }
