"""Why a pool's pods are not coming up, in the words of the component that knows (pure).

A Deployment whose pods cannot be created, scheduled or started says so only on objects a user
of the pool never looks at. This module reads them and returns :class:`Problem` s for the pool's
``Degraded`` condition and its Warning Events, quoting the message as written:

- the Deployment's ``ReplicaFailure`` condition, which the Deployment controller copies from its
  ReplicaSet (reason ``FailedCreate``: PodSecurity, ResourceQuota, LimitRange, an admission
  webhook), and ``Progressing=False`` (``ProgressDeadlineExceeded``);
- ``PodScheduled=False`` of a pod Pending longer than a threshold: the scheduler's reason;
- a container (the model server, or the sidecar, a restartable init container) waiting with a
  reason that needs a human: image pull errors, a config the kubelet cannot build, crash loops.

Messages carry no ages or counters that change between reconciles, so a Problem seen again is
the same text and is not posted as an Event twice. Pods are read through the attributes of the
Kubernetes client's ``V1Pod`` (duck-typed: this module imports no client).
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Container waiting reasons that do not resolve by waiting (kubelet: images, kuberuntime).
STUCK_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "CrashLoopBackOff",
    }
)


# The ReplicaSet names the pod it tried to create, a new random name per attempt.
_GENERATED_POD = re.compile(r'pods "[^"]*" is forbidden: ')


class Reason:
    """The ``Degraded`` condition's reasons (and its Warning Events'): CamelCase, one per cause.

    The first problem found gives the condition its reason; the message lists every problem.
    """

    API_REFUSED = "ApiRefused"  # the API server (or an admission webhook) refused a child
    POD_CREATE_FAILED = "PodCreateFailed"  # the ReplicaSet cannot create pods (PodSecurity, quota)
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"  # the Deployment's own reason
    UNSCHEDULABLE = "Unschedulable"  # Pending past the threshold, with the scheduler's message
    KARPENTER_CANNOT_PLACE = "KarpenterCannotPlace"  # Karpenter says no instance type can hold the pod
    NODE_POOL_LIMIT_REACHED = "NodePoolLimitReached"  # the NodePool's nvidia.com/gpu limit holds pods
    IMAGE_PULL_FAILED = "ImagePullFailed"  # ErrImagePull, ImagePullBackOff, InvalidImageName, ...
    CONTAINER_CREATE_FAILED = "ContainerCreateFailed"  # CreateContainerConfigError, CreateContainerError
    CRASH_LOOPING = "CrashLooping"  # CrashLoopBackOff
    ABOVE_MAX_REPLICAS = "AboveMaxReplicas"  # spec.replicas above scaling.maxReplicas
    KEDA_FAILED = "KedaFailed"  # the ScaledObject could not be applied, or its HPA was wrong
    NODE_POOL_NAME_TAKEN = "NodePoolNameTaken"  # the pool's NodePool name is another pool's NodePool


def _waiting_reason(kubelet_reason: str) -> str:
    if "Image" in kubelet_reason:
        return Reason.IMAGE_PULL_FAILED
    if kubelet_reason == "CrashLoopBackOff":
        return Reason.CRASH_LOOPING
    return Reason.CONTAINER_CREATE_FAILED


@dataclass(frozen=True)
class Problem:
    """One reason the pool is Degraded: ``reason`` is a :class:`Reason` (the Event's reason too)."""

    reason: str
    message: str


def deployment(live: Mapping[str, Any] | None) -> list[Problem]:
    """Failure conditions of the pool's Deployment as returned by the API server (camelCase dict)."""
    if not live:
        return []
    name = live.get("metadata", {}).get("name", "?")
    found = []
    for cond in (live.get("status") or {}).get("conditions") or []:
        ctype, status = cond.get("type"), cond.get("status")
        reason, message = cond.get("reason") or ctype, cond.get("message") or "no message"
        if ctype == "ReplicaFailure" and status == "True":
            message = _GENERATED_POD.sub("", message)
            found.append(
                Problem(Reason.POD_CREATE_FAILED, f"Deployment {name} cannot create pods ({reason}): {message}")
            )
        elif ctype == "Progressing" and status == "False":
            found.append(
                Problem(
                    Reason.PROGRESS_DEADLINE_EXCEEDED, f"Deployment {name} is not progressing ({reason}): {message}"
                )
            )
    return found


def _unschedulable_since(pod: Any) -> tuple[float | None, str]:
    if pod.status.phase != "Pending" or pod.spec.node_name or pod.metadata.deletion_timestamp:
        return None, ""
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            since = cond.last_transition_time.timestamp() if cond.last_transition_time else None
            return since, cond.message or cond.reason or "no reason given"
    return None, ""


def _gpus(pod: Any) -> int:
    """``nvidia.com/gpu`` the pod's containers ask for (limits, else requests), summed; 0 if none."""
    total = 0
    for container in getattr(pod.spec, "containers", None) or []:
        resources = container.resources
        asked = (resources.limits or {}) if resources else {}
        if "nvidia.com/gpu" not in asked and resources:
            asked = resources.requests or {}
        try:
            total += int(asked.get("nvidia.com/gpu", 0))
        except (TypeError, ValueError):
            continue
    return total


# Karpenter v1.14.1 counts every GPU of a node it would launch against the NodePool's limit; the
# default limit counts the pods' GPUs, so with instance types of 8 GPUs and pods of 1, a limit of
# (maxReplicas + warm + 1) x 1 launches nothing (seen with the real Karpenter, kwok provider).
_OVER_LIMITS_HINT = (
    " (Karpenter counts all the GPUs of a node it would launch against the NodePool's nvidia.com/gpu limit; "
    "tidegate's default limit is (scaling.maxReplicas + warmPool.size + 1) x GPUs per replica: when every "
    "instance type has more GPUs than that leaves, set spec.nodePool.limits)"
)


def unschedulable(
    pods: Iterable[Any],
    now_s: float,
    threshold_s: float,
    karpenter_says: Mapping[str, str] | None = None,
    node_pool_filtered: str | None = None,
) -> list[Problem]:
    """Pods Pending unscheduled for ``threshold_s`` or longer, grouped by the scheduler's message
    and the GPUs each asks for (a rollout to another ``gpus`` has pods of both counts Pending).

    ``karpenter_says``: Karpenter's own message per pod uid (:func:`tidegate.operator.karpenter.cannot_place`);
    a pod it names is reported with Karpenter's words, which say why no node is launched, where the
    scheduler only says that no node matches the NodePool's selector.

    ``node_pool_filtered``: Karpenter's word that the NodePool's requirements leave it no instance type
    (:func:`tidegate.operator.karpenter.filtered_out`); then that is why every such pod waits, whatever
    else was said of each.
    """
    karpenter_says = karpenter_says or {}
    by_message: dict[tuple[str, int], list[str]] = {}  # (scheduler message, nvidia.com/gpu per pod) -> pods
    by_karpenter: dict[str, list[str]] = {}
    for pod in pods:
        since, message = _unschedulable_since(pod)
        if since is None or now_s - since < threshold_s:
            continue
        if says := node_pool_filtered or karpenter_says.get(pod.metadata.uid or ""):
            by_karpenter.setdefault(says, []).append(pod.metadata.name)
        else:
            by_message.setdefault((message, _gpus(pod)), []).append(pod.metadata.name)
    found = [
        Problem(
            Reason.KARPENTER_CANNOT_PLACE,
            f"{_pods(pod_names)} Pending for over {threshold_s:g} s, Karpenter launches no node for {'it' if len(pod_names) == 1 else 'them'}: {says}"
            + (_OVER_LIMITS_HINT if "exceed limits" in says else ""),
        )
        for says, pod_names in by_karpenter.items()
    ]
    for (message, n), pod_names in by_message.items():
        hint = ""
        if "nvidia.com/gpu" in message:
            hint = (
                f" (each pod asks for {n} nvidia.com/gpu: is the NVIDIA device plugin running, is the NodePool at "
                f"its limit, and does any node offer {n} GPUs?)"
                if n > 1
                else " (is the NVIDIA device plugin running, or is the NodePool at its limit?)"
            )
        found.append(
            Problem(
                Reason.UNSCHEDULABLE,
                f"{_pods(pod_names)} Pending for over {threshold_s:g} s, the scheduler says: {message}{hint}",
            )
        )
    return found


def containers(pods: Iterable[Any]) -> list[Problem]:
    """Containers of live pods waiting for a reason that needs a human, grouped by reason and message."""
    by_cause: dict[tuple[str, str, str], list[str]] = {}
    for pod in pods:
        if pod.metadata.deletion_timestamp:
            continue
        statuses = [*(pod.status.init_container_statuses or []), *(pod.status.container_statuses or [])]
        for cs in statuses:
            waiting = cs.state.waiting if cs.state else None
            if waiting is None or waiting.reason not in STUCK_WAITING:
                continue
            message = waiting.message or ""
            if waiting.reason == "CrashLoopBackOff" and cs.last_state and cs.last_state.terminated:
                ended = cs.last_state.terminated
                message = f"last exit {ended.exit_code} ({ended.reason or 'Error'})"
            by_cause.setdefault((cs.name, waiting.reason, message), []).append(pod.metadata.name)
    return [
        Problem(
            _waiting_reason(reason),
            f"container {container} of {_pods(pod_names)}: {reason}" + (f": {message}" if message else ""),
        )
        for (container, reason, message), pod_names in by_cause.items()
    ]


def _pods(pod_names: list[str]) -> str:
    if len(pod_names) == 1:
        return f"pod {pod_names[0]}"
    shown = ", ".join(sorted(pod_names)[:3])
    return f"{len(pod_names)} pods ({shown}{', ...' if len(pod_names) > 3 else ''})"
