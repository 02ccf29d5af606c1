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
    NAME_TAKEN = "NameTaken"  # an object of that name belongs to another pool (or to no pool)


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
    no_service: str = ""  # why the pool's Service could not be applied ("" when it was): nothing reaches the replicas


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
    # Replicas ready behind a Service the API server refused serve nobody: not Ready, whatever the pods say.
    serving = p.ready_active >= observed.desired_active and not observed.no_service
    warm_full = p.warm_ready >= observed.warm_size
    converged = p.empty and serving and warm_full and p.draining == 0
    summary = f"{p.ready_active}/{observed.desired_active} active ready, {p.warm_ready}/{observed.warm_size} warm ready"
    if p.draining:
        summary += f", {p.draining} draining"
    if observed.notes:
        summary += f" ({'; '.join(observed.notes)})"
    ready_reason, ready_message = ("Serving" if serving else "WaitingForReplicas"), summary
    if observed.no_service:
        ready_reason = "NoService"
        ready_message = f"{summary}; no requests reach them: {observed.no_service}"
    conditions = [
        _condition(ConditionType.READY, serving, ready_reason, ready_message, gen, old, now_s),
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


# The conditions a human hears about when they change (``Progressing`` moves on every scale: it is not news).
ANNOUNCED = (
    ConditionType.READY,
    ConditionType.DEGRADED,
    ConditionType.SCALER_REACHABLE,
    ConditionType.KEDA_READY,
    ConditionType.NODE_POOL_READY,
)
# Bad reasons a new pool passes through on its way up: not news when a condition is first written with them.
_STARTING = frozenset({"WaitingForReplicas", Integration.NOT_RECONCILED.value})


@dataclass(frozen=True)
class Change:
    """A condition that changed in a way worth one Event and one log line."""

    type: str
    status: str
    reason: str
    message: str
    bad: bool  # turned bad (a Warning Event, a WARNING line); False: it recovered (Normal, INFO)

    @property
    def text(self) -> str:
        return f"{self.type}={self.status} {self.reason}: {self.message}"


def _bad(cond: Mapping[str, Any]) -> bool:
    good = "False" if cond.get("type") == ConditionType.DEGRADED else "True"
    return cond.get("status") != good


def changes(old_status: Mapping[str, Any], new_status: Mapping[str, Any]) -> list[Change]:
    """The announced conditions that changed between two ``status`` objects (pure).

    A change is a new status or, for the integrations, a new reason (KedaReady ``ScalerUnreachable``
    -> ``NotReady`` is another cause). Every reconcile writes the same conditions again; those are
    no change, so each transition is announced once. A condition written for the first time is
    announced only when it is bad for a reason other than a new pool's start (``WaitingForReplicas``,
    ``NotReconciled``). ``Ready`` counts as bad only when no active replica is ready: a scale-up
    waiting for its new replicas keeps serving, and replicas that cannot come up are ``Degraded``.
    ``Degraded`` turning True is left to its problems' own Warning Events (one per problem, each
    with its reason); here only its recovery.
    """
    old = {c["type"]: c for c in old_status.get("conditions") or [] if "type" in c}
    found = []
    for cond in new_status.get("conditions") or []:
        ctype = cond.get("type")
        if ctype not in ANNOUNCED:
            continue
        before = old.get(ctype)
        if ctype == ConditionType.READY:
            bad = cond["status"] != "True" and not new_status.get("readyReplicas")
            was_bad = before is None or (before.get("status") != "True" and not old_status.get("readyReplicas"))
            if bad == was_bad:
                continue
        elif before is None:
            bad = _bad(cond)
            if not bad or cond.get("reason") in _STARTING or ctype == ConditionType.DEGRADED:
                continue  # a first Degraded=True is its problems' own Warning Events already
        else:
            bad = _bad(cond)
            if (before.get("status"), before.get("reason")) == (cond.get("status"), cond.get("reason")):
                continue
            if ctype == ConditionType.DEGRADED and bad:
                continue
        found.append(Change(ctype, cond["status"], cond.get("reason", ""), cond.get("message", ""), bad))
    return found
