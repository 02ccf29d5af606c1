"""One reconcile of one InferencePool: compute the full desired state and converge to it.

Level-triggered and idempotent: every call rebuilds every child from the spec and applies it
(server-side apply makes an unchanged child a no-op), plans the warm pool from the pods as
they are now, and writes status. A crash between any two steps leaves a state the next call
converges from. Pods are relabelled first (a promotion is the latency users wait on), then the
children are applied, the Deployment last, so it is never shrunk before draining pods are
marked (pod-deletion-cost then spares active ones); nothing is deleted that a later step needs.

The Service selects ``tidegate.dev/serving=true``, a label the operator keeps on every pod beside
its role (:mod:`tidegate.operator.warm_pool`), never in the Deployment's template, so flipping
``spec.warmPool.serve`` relabels pods and rolls none. The Service of a pool whose active pods do not
all carry it yet (pods of an operator before it) keeps selecting ``role=active`` until they are
read back labelled (:func:`warm_pool.serving_selector_safe`): no request finds an empty Service
during an operator upgrade.

A child the API server refuses does not stop the reconcile: the others are still applied and the
status is still written, with the server's message in ``Degraded``, so the pool says why it is not
serving. So do the failures of its pods (:mod:`tidegate.operator.failures`). Each new reason is
also a Warning Event and one WARNING log line naming the pool; a reason already in the pool's
``Degraded`` message is not repeated. So is a condition that turns bad (``ScalerReachable``,
``KedaReady``, ``NodePoolReady``, ``Ready`` with nothing serving), and its recovery a Normal Event and
an INFO line: once per transition, never per reconcile (:func:`conditions.changes`).
"""

import json
import logging
import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kubernetes

from tidegate.admission.stats import STATS_PATH, StatsSnapshot
from tidegate.api import API_VERSION, KIND, constants
from tidegate.api.pool import InferencePool
from tidegate.operator import builders, conditions, failures, karpenter, logs, names, signal, warm_pool
from tidegate.operator.conditions import Integration
from tidegate.operator.failures import Problem, Reason
from tidegate.operator.kube import Kube, Refused
from tidegate.operator.settings import OperatorSettings

logger = logging.getLogger(__name__)

ScalerProbe = Callable[[str], bool]


@dataclass(frozen=True)
class Result:
    """What a reconcile did (for logs and tests)."""

    plan: warm_pool.Plan
    status: dict[str, Any]
    events: list[str]
    requeue_after_s: float | None = None  # reconcile again this soon (pods still draining)


def owner_reference(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def adopt(manifest: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with ``owner`` as its controller (namespaced children only)."""
    return {**manifest, "metadata": {**manifest["metadata"], "ownerReferences": [owner]}}


def _is_ready(pod: kubernetes.client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _in_flight(pod: kubernetes.client.V1Pod, port: int, timeout_s: float = 0.3) -> int | None:
    """Requests in flight per the pod's sidecar stats; None when it does not answer."""
    ip = pod.status.pod_ip
    if not ip:
        return None
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}{STATS_PATH}", timeout=timeout_s) as resp:
            return StatsSnapshot.model_validate_json(resp.read()).in_flight_requests  # the shared contract
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        return None


def pod_view(pod: kubernetes.client.V1Pod, sidecar_port: int) -> warm_pool.PodView:
    meta = pod.metadata
    labels = meta.labels or {}
    annotations = meta.annotations or {}
    role = labels.get(constants.LABEL_ROLE, constants.ROLE_WARM)
    since = annotations.get(names.ANNOTATION_DRAINING_SINCE)
    return warm_pool.PodView(
        name=meta.name,
        role=role,
        ready=_is_ready(pod),
        created_s=meta.creation_timestamp.timestamp() if meta.creation_timestamp else 0.0,
        deleting=meta.deletion_timestamp is not None,
        draining_since_s=float(since) if since else None,
        in_flight=_in_flight(pod, sidecar_port) if role == constants.ROLE_DRAINING else None,
        serving=labels.get(constants.LABEL_SERVING),
    )


def push_role(
    ip: str | None, port: int, role: str, token: str | None, timeout_s: float = 0.3, serving: bool | None = None
) -> bool:
    """Tell a pod's sidecar its new role, and whether the Service sends it requests (its
    ``tidegate.dev/serving`` label), at once: ``PUT /tidegate/role`` ``{"role", "serving"}``. False
    when it does not answer. The downward-API labels file says the same later, so a miss only costs
    time."""
    if not ip:
        return False
    body: dict[str, Any] = {"role": role} if serving is None else {"role": role, "serving": serving}
    request = urllib.request.Request(
        f"http://{ip}:{port}/tidegate/role",
        data=json.dumps(body).encode(),
        method="PUT",
        headers={"Content-Type": "application/json", **({names.DRAIN_TOKEN_HEADER: token} if token else {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return resp.status == 200
    except OSError:
        return False


def after_drain_events(after: warm_pool.AfterDrain, warm_size: int) -> list[str]:
    """The Event messages for :func:`after_drain`'s split (empty when nothing finished draining)."""
    events = []
    if after.returned:
        events.append(
            f"{len(after.returned)} drained replica(s) returned to the warm pool: {', '.join(after.returned)}"
        )
    if after.removed:
        events.append(
            f"{len(after.removed)} drained replica(s) removed, the warm pool of {warm_size} being full: "
            f"{', '.join(after.removed)}"
        )
    return events


def _relabel(
    kube: Kube,
    namespace: str,
    plan: warm_pool.Plan,
    now_s: float,
    ips: dict[str, str | None] | None = None,
    port: int = 0,
    token: str | None = None,
    removed: frozenset[str] = frozenset(),
    roles: dict[str, str] | None = None,
    serve: bool = False,
) -> None:
    """Write the plan's roles and ``tidegate.dev/serving`` labels on the pods (one patch per pod,
    the role and its serving label together) and push each change to the pod's sidecar.

    ``roles``: each pod's role as observed (for the pods whose serving label alone changes);
    ``serve``: ``spec.warmPool.serve``.
    """
    serving = warm_pool.serving_labels(plan, removed)

    def labels(name: str, role: str) -> dict[str, str | None]:
        if name not in serving:
            return {constants.LABEL_ROLE: role}
        return {constants.LABEL_ROLE: role, constants.LABEL_SERVING: str(serving[name]).lower()}

    for name in plan.promote:
        kube.patch_pod(
            namespace,
            name,
            labels(name, constants.ROLE_ACTIVE),
            {
                names.ANNOTATION_DO_NOT_DISRUPT: "true",
                names.ANNOTATION_DELETION_COST: str(names.COST_ACTIVE),
                names.ANNOTATION_DRAINING_SINCE: None,
            },
        )
    for name in plan.drain:
        kube.patch_pod(
            namespace,
            name,
            labels(name, constants.ROLE_DRAINING),
            {
                names.ANNOTATION_DO_NOT_DISRUPT: "true",  # still finishing requests
                names.ANNOTATION_DELETION_COST: str(names.COST_DRAINING),
                names.ANNOTATION_DRAINING_SINCE: f"{now_s:.3f}",
            },
        )
    for name in plan.return_to_warm:
        # One the warm pool has no room for keeps the draining cost: the ReplicaSet deletes it,
        # not a warm replica. Labelled warm all the same, so it is never drained twice.
        cost = names.COST_DRAINING if name in removed else names.COST_WARM
        kube.patch_pod(
            namespace,
            name,
            labels(name, constants.ROLE_WARM),
            {
                names.ANNOTATION_DO_NOT_DISRUPT: "true",  # warm: its loaded model is capacity too
                names.ANNOTATION_DELETION_COST: str(cost),
                names.ANNOTATION_DRAINING_SINCE: None,
            },
        )
    relabelled = {
        **{n: constants.ROLE_ACTIVE for n in plan.promote},
        **{n: constants.ROLE_DRAINING for n in plan.drain},
        **{n: constants.ROLE_WARM for n in plan.return_to_warm},
    }
    roles = roles or {}
    label_only = [n for n in serving if n not in relabelled]
    for name in label_only:
        # The serving label alone changes (a new pod, spec.warmPool.serve flipped, an operator
        # upgrade); protected in the same patch, as every replica is (see _protect).
        kube.patch_pod(
            namespace,
            name,
            {constants.LABEL_SERVING: str(serving[name]).lower()},
            {names.ANNOTATION_DO_NOT_DISRUPT: "true"},
        )
    ips = ips or {}
    for name in [*relabelled, *label_only]:
        role = relabelled.get(name) or roles.get(name, constants.ROLE_WARM)
        in_service = serving.get(name, warm_pool.serves(role, serve)) and name not in removed
        push_role(ips.get(name), port, role, token, serving=in_service)


def _protect(kube: Kube, namespace: str, pods: list[kubernetes.client.V1Pod], plan: warm_pool.Plan) -> None:
    """``karpenter.sh/do-not-disrupt`` on every replica the plan did not just relabel, warm ones too.

    A warm replica evicted by Karpenter's consolidation or drift reloads its model for minutes, and
    a new pod may land on a node Karpenter found empty a moment before; pod events reconcile at
    once, so a new pod carries it within a second of being created. Patched on the pods, not put
    in the Deployment's template, so adopting it rolls no replica (Karpenter v1 "Disruption",
    pod-level controls: https://karpenter.sh/docs/concepts/disruption/).
    """
    relabelled = {*plan.promote, *plan.drain, *plan.return_to_warm, *plan.label_serving}
    for pod in pods:
        meta = pod.metadata
        if meta.deletion_timestamp or meta.name in relabelled:
            continue
        if (meta.annotations or {}).get(names.ANNOTATION_DO_NOT_DISRUPT) != "true":
            kube.patch_pod(namespace, meta.name, {}, {names.ANNOTATION_DO_NOT_DISRUPT: "true"})


def _keda_not_ready(scaled_object: dict[str, Any]) -> str | None:
    """KEDA's own words when it reports the ScaledObject not Ready (e.g. ``TriggerError`` while the
    scaler is down and no fallback is set: KEDA v2.21.0 ``pkg/scaling/executor/scale_scaledobjects.go``)."""
    for cond in (scaled_object.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") == "False":
            return f"{cond.get('reason') or 'NotReady'}: {cond.get('message') or 'no message'}"
    return None


def _hpa_cannot_scale(hpa: dict[str, Any]) -> str | None:
    """The HPA's own words when it cannot compute a replica count (``ScalingActive=False``, e.g.
    ``FailedGetExternalMetric`` while KEDA's metrics API server is down: nothing scales the pool,
    though KEDA still reports the ScaledObject Ready). None while it scales, and at 0 replicas
    (``ScalingDisabled``: KEDA's own loop decides 0 <-> 1). The label-selector dump is left out."""
    for cond in (hpa.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "ScalingActive" and cond.get("status") == "False":
            if cond.get("reason") == "ScalingDisabled":
                return None
            message = re.sub(r"/&LabelSelector\{.*?LabelSelectorRequirement\{\},\}", "", cond.get("message") or "")
            return f"{cond.get('reason') or 'ScalingInactive'}: {message or 'no message'}"
    return None


def _keda(kube: Kube, settings: OperatorSettings, pool: InferencePool, owner: dict[str, Any], probe: ScalerProbe):
    name, ns = pool.metadata.name, pool.metadata.namespace
    if not pool.spec.scaling.keda:
        if kube.has_api("keda.sh/v1alpha1", "ScaledObject"):
            kube.delete("keda.sh/v1alpha1", "ScaledObject", name, ns)
        return Integration.DISABLED, "scaling.keda is false: scale with kubectl scale", None, None
    if not kube.has_api("keda.sh/v1alpha1", "ScaledObject"):
        return (
            Integration.CRD_MISSING,
            "KEDA is not installed (no keda.sh/v1alpha1 ScaledObject): install KEDA 2.17+",
            None,
            None,
        )
    reachable = probe(settings.scaler_address) if settings.require_scaler else None
    exists = kube.get("keda.sh/v1alpha1", "ScaledObject", name, ns) is not None
    if reachable is False and not exists:
        return (
            Integration.SCALER_UNREACHABLE,
            f"not creating the ScaledObject: the tidegate scaler at {settings.scaler_address} does not answer",
            reachable,
            None,
        )
    live = kube.apply(adopt(builders.scaled_object(pool, settings), owner))
    keda_says = _keda_not_ready(live)
    message = f"ScaledObject {name} targets this pool through /scale (scaler {settings.scaler_address})"
    hpa = kube.get("autoscaling/v2", "HorizontalPodAutoscaler", f"keda-hpa-{name}", ns)
    if hpa is not None:
        metrics = hpa.get("spec", {}).get("metrics") or []
        if not any(m.get("type") == "External" for m in metrics):
            kube.delete("autoscaling/v2", "HorizontalPodAutoscaler", f"keda-hpa-{name}", ns)
            return (
                Integration.FAILED,
                f"HPA keda-hpa-{name} did not use the external metric: deleted for KEDA to rebuild",
                reachable,
                keda_says,
            )
    if hpa is None and not (live.get("status") or {}).get("conditions"):
        # Karpenter's NotReconciled, for KEDA: the ScaledObject is written but no KEDA operator acted on it
        return (
            Integration.NOT_RECONCILED,
            f"KEDA has not reconciled ScaledObject {name} (no status conditions, no HPA keda-hpa-{name}): "
            "is the KEDA operator running? Nothing scales this pool until it does",
            reachable,
            None,
        )
    if keda_says:
        # KEDA took the ScaledObject but cannot act on it (e.g. ScaledObjectCheckFailed while the
        # scaler does not answer GetMetricSpec): nothing scales this pool until it is Ready.
        return (
            Integration.NOT_READY,
            f"KEDA reports ScaledObject {name} not Ready: {keda_says} (scaler {settings.scaler_address})",
            reachable,
            keda_says,
        )
    if hpa is not None and (stuck := _hpa_cannot_scale(hpa)):
        return (
            Integration.NOT_READY,
            f"HPA keda-hpa-{name} cannot compute this pool's replicas, so nothing scales it: {stuck} "
            "(KEDA's metrics API server answers it: kubectl get apiservice v1beta1.external.metrics.k8s.io)",
            reachable,
            None,
        )
    return Integration.APPLIED, message, reachable, keda_says


def _pod_gpus(pod: kubernetes.client.V1Pod) -> int:
    total = 0
    for container in pod.spec.containers or []:
        res = container.resources
        quantity = ((res.limits or {}) if res else {}).get(karpenter.GPU_RESOURCE) or (
            ((res.requests or {}) if res else {}).get(karpenter.GPU_RESOURCE)
        )
        total += karpenter.gpu_count(quantity) or 0
    return total


def _unschedulable_for(pod: kubernetes.client.V1Pod, now_s: float) -> float | None:
    """Seconds ``pod`` has been unschedulable (Pending, no node, PodScheduled=False); None otherwise."""
    if pod.status.phase != "Pending" or pod.spec.node_name or pod.metadata.deletion_timestamp:
        return None
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return now_s - (cond.last_transition_time.timestamp() if cond.last_transition_time else now_s)
    return None


def _node_pool(
    kube: Kube, pool: InferencePool, pods: list[kubernetes.client.V1Pod], now_s: float, pending_threshold_s: float
) -> tuple[Integration, str, str | None, dict[str, Any] | None]:
    """The NodePool applied and Karpenter's view of it: (state, message, why pods wait on its limit,
    the live NodePool as applied or None)."""
    np_name = names.node_pool_name(pool)
    has_api = kube.has_api("karpenter.sh/v1", "NodePool")
    existing = kube.get("karpenter.sh/v1", "NodePool", np_name) if has_api else None
    if not pool.spec.node_pool.enabled:
        if existing and names.owns_node_pool(pool, existing):
            kube.delete("karpenter.sh/v1", "NodePool", np_name)
        return Integration.DISABLED, "nodePool.enabled is false: pods use existing GPU nodes", None, None
    if not has_api:
        return (
            Integration.CRD_MISSING,
            "Karpenter is not installed (no karpenter.sh/v1 NodePool): install Karpenter v1",
            None,
            None,
        )
    if existing and not names.owns_node_pool(pool, existing):
        ns, other = names.node_pool_owner(existing)
        whose = f"pool {ns}/{other}" if ns and other else "no tidegate pool (made by hand or another tool)"
        return (
            Integration.NAME_TAKEN,
            f"NodePool {np_name} (tidegate-<namespace>-<pool>) belongs to {whose}: tidegate leaves it as it is; "
            "rename this pool or move it to another namespace",
            None,
            None,
        )
    live = kube.apply(builders.stamp_template(builders.node_pool(pool), existing, now_s))
    verdict = karpenter.readiness(live)
    state = {"Ready": Integration.APPLIED, "NotReconciled": Integration.NOT_RECONCILED}.get(
        verdict.reason, Integration.NOT_READY
    )
    live_pods = [p for p in pods if not p.metadata.deletion_timestamp]
    pending = [
        _pod_gpus(p)
        for p in live_pods
        if (age := _unschedulable_for(p, now_s)) is not None and age >= pending_threshold_s
    ]
    placed = sum(_pod_gpus(p) for p in live_pods if p.spec.node_name)
    return state, verdict.message, karpenter.limit_reached(live, pending, placed), live


def _karpenter_says(
    kube: Kube,
    pool: InferencePool,
    pods: list[kubernetes.client.V1Pod],
    now_s: float,
    threshold_s: float,
    np_state: Integration,
    node_pool: dict[str, Any] | None,
) -> tuple[dict[str, str], str | None]:
    """What Karpenter says of the pool's long-Pending pods: its FailedScheduling message per pod uid, and
    its word on the NodePool when its requirements leave no instance type (None else). Read only when
    the pool has a NodePool (``node_pool``, live, as applied) Karpenter serves (``np_state``) and some pod
    has been unschedulable for ``threshold_s``."""
    if np_state not in (Integration.APPLIED, Integration.NOT_READY) or node_pool is None:
        return {}, None
    if not any((age := _unschedulable_for(p, now_s)) is not None and age >= threshold_s for p in pods):
        return {}, None
    np_name = names.node_pool_name(pool)
    events = kube.pod_events(pool.metadata.namespace, "FailedScheduling", "karpenter")
    requirements = [r.model_dump(mode="json", exclude_none=True) for r in pool.spec.node_pool.requirements]
    filtered = karpenter.filtered_out(
        kube.node_pool_events(np_name, karpenter.NO_COMPATIBLE_INSTANCE_TYPES),
        node_pool,
        now_s,
        requirements,
        [c.value for c in pool.spec.node_pool.capacity_types],
    )
    return karpenter.cannot_place(events, np_name, karpenter.template_changed_s(node_pool)), filtered


def _apply_or_report(kube: Kube, manifest: dict[str, Any], problems: list[Problem]) -> dict[str, Any] | None:
    """Apply ``manifest``; when the API server refuses it, add why to ``problems`` and return None."""
    try:
        return kube.apply(manifest)
    except Refused as refused:
        problems.append(Problem(Reason.API_REFUSED, str(refused)))
        return None


def _desired_active(pool: InferencePool) -> tuple[int, str | None]:
    """Active replicas to serve: ``spec.replicas`` held within ``scaling.minReplicas..maxReplicas``,
    and, when raised to minReplicas, a note saying so (above maxReplicas is Degraded, said elsewhere)."""
    scaling = pool.spec.scaling
    if pool.spec.replicas > scaling.max_replicas:
        return scaling.max_replicas, None
    if pool.spec.replicas < scaling.min_replicas:
        return scaling.min_replicas, (
            f"spec.replicas {pool.spec.replicas} is below scaling.minReplicas {scaling.min_replicas}: "
            f"serving {scaling.min_replicas}"
        )
    return pool.spec.replicas, None


def _announce(
    kube: Kube, obj: dict[str, Any], problems: list[Problem], old_status: dict[str, Any], new_status: dict[str, Any]
) -> None:
    """The one place a pool's news becomes Events and log lines, each once.

    A Warning Event and a WARNING line for each problem not already in the pool's Degraded message,
    and for each condition that turned bad (:func:`conditions.changes`); a Normal Event and an INFO
    line for each that recovered.
    """
    old_conditions = old_status.get("conditions") or []
    old = next((c for c in old_conditions if c.get("type") == "Degraded"), {})
    seen = old.get("message", "") if old.get("status") == "True" else ""
    log = logs.for_pool(logger, obj["metadata"]["namespace"], obj["metadata"]["name"])
    for problem in problems:
        if problem.message in seen:
            log.debug("still degraded: %s", problem.message)
            continue
        log.warning("degraded: %s", problem.message)
        kube.event(obj, problem.reason, problem.message, warning=True)
    for change in conditions.changes(old_status, new_status):
        (log.warning if change.bad else log.info)("%s", change.text)
        kube.event(obj, change.reason, f"{change.type}={change.status}: {change.message}", warning=change.bad)


def reconcile(
    kube: Kube, settings: OperatorSettings, obj: dict[str, Any], probe: ScalerProbe, now_s: float | None = None
) -> Result:
    """Converge one pool's children to its spec and write its status.

    Raises ``pydantic.ValidationError`` when the spec breaks a rule the CRD could not check,
    and ``kubernetes.client.ApiException`` on API errors (the caller retries).
    """
    now_s = time.time() if now_s is None else now_s
    pool = InferencePool.model_validate(obj)
    ns, name = pool.metadata.namespace, pool.metadata.name
    owner = owner_reference(obj)
    pods = kube.pool_pods(ns, name)
    drain_timeout = settings.drain_timeout_seconds or pool.spec.admission.request_timeout_seconds
    # maxReplicas is the GPU budget: a hand `kubectl scale` above it is held at it and reported.
    # minReplicas is the floor: a pool applied with replicas below it (the default 1 under
    # minReplicas: 2, before any autoscaler wrote) serves minReplicas, and says so.
    desired_active, below_min = _desired_active(pool)
    views = [pod_view(p, settings.sidecar_port) for p in pods]
    serve = pool.spec.warm_pool.serve
    plan = warm_pool.plan(views, desired_active, pool.spec.warm_pool.size, now_s, drain_timeout, serve)
    after = warm_pool.after_drain(views, plan, pool.spec.warm_pool.size)
    ips = {p.metadata.name: p.status.pod_ip for p in pods}
    roles = {v.name: v.role for v in views}
    token = names.drain_token(pool)
    _relabel(kube, ns, plan, now_s, ips, settings.sidecar_port, token, frozenset(after.removed), roles, serve)
    _protect(kube, ns, pods, plan)
    events = []
    active_before = plan.active - len(plan.promote) + len(plan.drain)
    if plan.promote:
        events.append(f"promoted {len(plan.promote)} warm replica(s): {active_before} -> {plan.active} active")
    if plan.drain:
        events.append(f"draining {len(plan.drain)} replica(s): {active_before} -> {plan.active} active")
    events += after_drain_events(after, pool.spec.warm_pool.size)
    problems: list[Problem] = []
    no_service = ""
    for manifest in (
        builders.admission_config_map(pool),
        builders.service(pool, settings, by_serving=warm_pool.serving_selector_safe(views)),
        builders.pod_disruption_budget(pool),
    ):
        before = len(problems)
        _apply_or_report(kube, adopt(manifest, owner), problems)
        if manifest["kind"] == "Service" and len(problems) > before:
            no_service = problems[-1].message
    live_deployment = _apply_or_report(
        kube, adopt(builders.deployment(pool, settings, plan.deployment_replicas), owner), problems
    )

    try:
        keda_state, keda_message, reachable, keda_says = _keda(kube, settings, pool, owner, probe)
    except Refused as refused:  # e.g. KEDA's admission webhook
        keda_state, keda_message, reachable, keda_says = Integration.FAILED, str(refused), None, None
    try:
        np_state, np_message, at_limit, live_np = _node_pool(kube, pool, pods, now_s, settings.gpu_pending_seconds)
    except Refused as refused:
        np_state, np_message, at_limit, live_np = Integration.FAILED, str(refused), None, None
        problems.append(Problem(Reason.API_REFUSED, str(refused)))
    if np_state is Integration.NAME_TAKEN:
        problems.append(Problem(Reason.NODE_POOL_NAME_TAKEN, np_message))
    problems += failures.deployment(live_deployment)
    # Pods held by the NodePool's limit are Pending for that reason, not for a missing device plugin.
    if at_limit:
        problems.append(Problem(Reason.NODE_POOL_LIMIT_REACHED, at_limit))
    else:
        says, filtered = _karpenter_says(kube, pool, pods, now_s, settings.gpu_pending_seconds, np_state, live_np)
        problems += failures.unschedulable(pods, now_s, settings.gpu_pending_seconds, says, filtered)
    problems += failures.containers(pods)
    if desired_active < pool.spec.replicas:
        problems.append(
            Problem(
                Reason.ABOVE_MAX_REPLICAS,
                f"spec.replicas {pool.spec.replicas} is above scaling.maxReplicas {pool.spec.scaling.max_replicas}: "
                f"serving {desired_active} (raise scaling.maxReplicas or scale down)",
            )
        )
    if keda_state is Integration.FAILED:
        problems.append(Problem(Reason.KEDA_FAILED, keda_message))

    observed = conditions.Observed(
        generation=obj["metadata"].get("generation", 0),
        desired_active=desired_active,
        warm_size=pool.spec.warm_pool.size,
        plan=plan,
        selector=names.selector_string(pool),
        keda=keda_state,
        keda_message=keda_message,
        node_pool=np_state,
        node_pool_message=np_message,
        scaler_reachable=reachable,
        scaler_address=settings.scaler_address,
        fallback_replicas=pool.spec.scaling.fallback_replicas,
        keda_says=keda_says,
        degraded_reasons=tuple(p.message for p in problems),
        degraded_reason=problems[0].reason if problems else "",
        notes=(below_min,) if below_min else (),
        no_service=no_service,
    )
    old_status = obj.get("status") or {}
    status = conditions.status(observed, old_status.get("conditions") or [])
    if settings.scaler_decisions_url and (decision := signal.fetch(settings.scaler_decisions_url, ns, name)):
        status.update(signal.to_status(decision))
        new_time = status["signal"].get("time")
        if decision.get("desired") != decision.get("current") and new_time != (old_status.get("signal") or {}).get(
            "time"
        ):
            events.append(f"scaler: {status['signal']['reason']}")
    kube.patch_pool_status(ns, name, status)
    for message in events:
        kube.event(obj, "Scaled", message)
    _announce(kube, obj, problems, old_status, status)
    # Draining pods end on a deadline or when their sidecar reports idle: nothing else will
    # trigger a reconcile then, so ask for one (poll at least every second while draining).
    requeue = min(1.0, drain_timeout) if plan.draining or plan.drain else None
    return Result(plan=plan, status=status, events=events, requeue_after_s=requeue)
