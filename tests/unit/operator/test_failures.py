"""Why a pool's pods are not coming up, read from its Deployment and pods (issue 14 item 2)."""

import datetime

import pytest
from kubernetes.client import (
    V1Container,
    V1ContainerState,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodCondition,
    V1PodSpec,
    V1PodStatus,
    V1ResourceRequirements,
)

from tidegate.operator import failures

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


def _pod(name: str, **status) -> V1Pod:
    return V1Pod(
        metadata=V1ObjectMeta(name=name),
        spec=V1PodSpec(containers=[V1Container(name="model")]),
        status=V1PodStatus(**status),
    )


def _waiting(container: str, reason: str, message: str | None = None, **kw) -> V1ContainerStatus:
    return V1ContainerStatus(
        name=container,
        image="x",
        image_id="",
        ready=False,
        restart_count=0,
        state=V1ContainerState(waiting=V1ContainerStateWaiting(reason=reason, message=message)),
        **kw,
    )


def test_replicaset_failed_create_is_quoted_without_the_random_pod_name() -> None:
    message = (
        'pods "small-6d4cf7b9c-x2x7k" is forbidden: violates PodSecurity "restricted:latest": '
        "allowPrivilegeEscalation != false"
    )
    deployment = {
        "metadata": {"name": "small"},
        "status": {"conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": message}]},
    }  # fmt: skip
    [problem] = failures.deployment(deployment)
    assert problem.reason == "PodCreateFailed"
    assert problem.message == (
        'Deployment small cannot create pods (FailedCreate): violates PodSecurity "restricted:latest": '
        "allowPrivilegeEscalation != false"
    )


def test_a_healthy_deployment_and_pods_say_nothing() -> None:
    deployment = {"metadata": {"name": "p"}, "status": {"conditions": [{"type": "Available", "status": "True"}]}}
    assert failures.deployment(deployment) == []
    assert failures.deployment(None) == []
    running = _pod("p-1", phase="Running", container_statuses=[])
    assert failures.unschedulable([running], NOW.timestamp(), 2) == []
    assert failures.containers([running]) == []


def test_unschedulable_pods_past_the_threshold_carry_the_schedulers_message_once() -> None:
    since = NOW - datetime.timedelta(seconds=30)
    says = "0/5 nodes are available: 5 Insufficient nvidia.com/gpu."
    cond = V1PodCondition(
        type="PodScheduled", status="False", reason="Unschedulable", message=says, last_transition_time=since
    )
    pods = [_pod(f"p-{i}", phase="Pending", conditions=[cond]) for i in range(2)]
    [problem] = failures.unschedulable(pods, NOW.timestamp(), threshold_s=10)
    assert problem.reason == "Unschedulable"
    assert problem.message.startswith("2 pods (p-0, p-1) Pending for over 10 s, the scheduler says: 0/5 nodes")
    assert "NVIDIA device plugin" in problem.message
    assert failures.unschedulable(pods, NOW.timestamp(), threshold_s=60) == []  # not yet


def test_a_pod_asking_for_more_gpus_than_one_node_has_is_told_to_check_the_node_size_too() -> None:
    # A pool with gpus: 16 on 8-GPU nodes: no device plugin or NodePool limit is at fault, so the
    # hint names the count the pods ask for (a new user was sent to the device plugin).
    since = NOW - datetime.timedelta(seconds=30)
    says = "0/5 nodes are available: 5 Insufficient nvidia.com/gpu."
    cond = V1PodCondition(
        type="PodScheduled", status="False", reason="Unschedulable", message=says, last_transition_time=since
    )
    model = V1Container(name="model", resources=V1ResourceRequirements(limits={"nvidia.com/gpu": "16"}))
    pod = V1Pod(
        metadata=V1ObjectMeta(name="p-0"),
        spec=V1PodSpec(containers=[model, V1Container(name="sidecar")]),
        status=V1PodStatus(phase="Pending", conditions=[cond]),
    )
    [problem] = failures.unschedulable([pod], NOW.timestamp(), threshold_s=10)
    assert problem.message.endswith(
        "(each pod asks for 16 nvidia.com/gpu: is the NVIDIA device plugin running, is the NodePool at its "
        "limit, and does any node offer 16 GPUs?)"
    )
    # Patched to 9 GPUs mid-rollout: the new pod is Pending with the same scheduler message, and is
    # not counted among those asking for 16 (found breaking it on the real cluster).
    nine = V1Container(name="model", resources=V1ResourceRequirements(limits={"nvidia.com/gpu": "9"}))
    new = V1Pod(
        metadata=V1ObjectMeta(name="p-1"),
        spec=V1PodSpec(containers=[nine]),
        status=V1PodStatus(phase="Pending", conditions=[cond]),
    )
    sixteen, nine_gpus = failures.unschedulable([pod, new], NOW.timestamp(), threshold_s=10)
    assert sixteen.message.startswith("pod p-0 Pending") and "each pod asks for 16" in sixteen.message
    assert nine_gpus.message.startswith("pod p-1 Pending") and "each pod asks for 9" in nine_gpus.message


def test_image_pull_errors_and_crash_loops_name_the_container_and_the_reason() -> None:
    pulled = _pod(
        "p-1",
        phase="Pending",
        container_statuses=[_waiting("model", "ImagePullBackOff", 'Back-off pulling image "vllm/vllm-openai:v9"')],
    )
    crashing = _pod(
        "p-2",
        phase="Running",
        init_container_statuses=[
            _waiting(
                "tidegate-admission",
                "CrashLoopBackOff",
                "back-off 40s",
                last_state=V1ContainerState(terminated=V1ContainerStateTerminated(exit_code=137, reason="OOMKilled")),
            )
        ],
    )
    creating = _pod("p-3", phase="Pending", container_statuses=[_waiting("model", "ContainerCreating")])
    problems = failures.containers([pulled, crashing, creating])
    assert [p.reason for p in problems] == ["ImagePullFailed", "CrashLooping"]
    assert problems[0].message == (
        'container model of pod p-1: ImagePullBackOff: Back-off pulling image "vllm/vllm-openai:v9"'
    )
    assert problems[1].message == "container tidegate-admission of pod p-2: CrashLoopBackOff: last exit 137 (OOMKilled)"


def test_a_container_the_kubelet_cannot_create_is_container_create_failed() -> None:
    pod = _pod("p-1", phase="Pending", container_statuses=[_waiting("model", "CreateContainerConfigError", "no key")])
    [problem] = failures.containers([pod])
    assert problem.reason == "ContainerCreateFailed"


def test_every_reason_is_camel_case_as_kubernetes_conventions_ask() -> None:
    reasons = [v for k, v in vars(failures.Reason).items() if k.isupper()]
    assert len(reasons) == len(set(reasons)) >= 10
    for reason in reasons:
        assert reason[0].isupper() and reason.isalnum(), reason


def test_a_pod_karpenter_cannot_place_is_reported_in_karpenters_words() -> None:
    since = NOW - datetime.timedelta(seconds=30)
    cond = V1PodCondition(
        type="PodScheduled",
        status="False",
        reason="Unschedulable",
        message="0/5 nodes are available: 5 node(s) didn't match Pod's node affinity/selector.",
        last_transition_time=since,
    )
    pods = [_pod(f"p-{i}", phase="Pending", conditions=[cond]) for i in range(2)]
    pods[0].metadata.uid = "u0"
    says = {"u0": "no instance type has enough resources, resources={...}"}
    karp, sched = failures.unschedulable(pods, NOW.timestamp(), threshold_s=10, karpenter_says=says)
    assert karp.reason == "KarpenterCannotPlace"
    assert karp.message == (
        "pod p-0 Pending for over 10 s, Karpenter launches no node for it: "
        "no instance type has enough resources, resources={...}"
    )
    assert sched.reason == "Unschedulable" and sched.message.startswith("pod p-1 ")  # no Karpenter event yet


def test_a_pod_over_the_limit_by_the_nodes_gpus_is_told_the_default_limit_and_the_field_to_set() -> None:
    # Real Karpenter v1.14.1 with only 8-GPU instance types and the default limit of 4 GPUs: nothing
    # launches, and Karpenter's words alone do not point at tidegate's default
    since = NOW - datetime.timedelta(seconds=30)
    cond = V1PodCondition(
        type="PodScheduled", status="False", reason="Unschedulable", message="", last_transition_time=since
    )
    pod = _pod("p-0", phase="Pending", conditions=[cond])
    pod.metadata.uid = "u0"
    says = {"u0": "all available instance types exceed limits for nodepool, resources={...}"}
    (karp,) = failures.unschedulable([pod], NOW.timestamp(), threshold_s=10, karpenter_says=says)
    assert karp.reason == "KarpenterCannotPlace"
    assert "(scaling.maxReplicas + warmPool.size + 1) x GPUs per replica" in karp.message
    assert "set spec.nodePool.limits" in karp.message


def test_a_node_pool_with_no_instance_type_is_why_every_pending_pod_waits() -> None:
    # Karpenter says it on the NodePool; what it said on each pod (or the scheduler's own message)
    # does not say why, so every pod long Pending is reported with the NodePool's words.
    since = NOW - datetime.timedelta(seconds=30)
    cond = V1PodCondition(
        type="PodScheduled", status="False", reason="Unschedulable", message="0/5 nodes", last_transition_time=since
    )
    pods = [_pod(f"p-{i}", phase="Pending", conditions=[cond]) for i in range(2)]
    pods[0].metadata.uid = "u0"
    says = {"u0": "nodepool requirements filtered out all available instance types"}
    filtered = "NodePool requirements filtered out ... due to minValues incompatibility (lower minValues)"
    (karp,) = failures.unschedulable(pods, NOW.timestamp(), 10, karpenter_says=says, node_pool_filtered=filtered)
    assert karp.reason == "KarpenterCannotPlace"
    assert karp.message == f"2 pods (p-0, p-1) Pending for over 10 s, Karpenter launches no node for them: {filtered}"
