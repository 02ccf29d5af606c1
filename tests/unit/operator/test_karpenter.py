"""What Karpenter writes on a NodePool, as the pool's conditions say it (pure part)."""

import datetime

from kubernetes.client import CoreV1Event, V1ObjectMeta, V1ObjectReference

from tidegate.operator import karpenter


def _node_pool(conditions=None, limit="2", in_use="0"):
    return {
        "metadata": {"name": "tidegate-ns-p"},
        "spec": {
            "limits": {"nvidia.com/gpu": limit},
            "template": {
                "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"}}
            },
        },
        "status": {"conditions": conditions or [], "resources": {"nvidia.com/gpu": in_use}, "nodes": 1},
    }


def test_a_node_pool_karpenter_never_touched_is_not_called_ready() -> None:
    verdict = karpenter.readiness(_node_pool())
    assert not verdict.ok and verdict.reason == "NotReconciled"
    assert "Karpenter has not reconciled NodePool tidegate-ns-p" in verdict.message
    assert "EC2NodeClass gpu (karpenter.k8s.aws)" in verdict.message


def test_not_ready_names_the_failing_condition_in_karpenters_words() -> None:
    verdict = karpenter.readiness(_node_pool([
        {"type": "Ready", "status": "False", "reason": "UnhealthyDependents"},
        {"type": "ValidationSucceeded", "status": "True"},
        {"type": "NodeClassReady", "status": "False", "reason": "NodeClassNotFound",
         "message": "NodeClass not found on cluster"},
        {"type": "NodeRegistrationHealthy", "status": "Unknown"},
    ]))  # fmt: skip
    assert not verdict.ok and verdict.reason == "NotReady"
    assert verdict.message.endswith("NodeClassReady=False (NodeClassNotFound: NodeClass not found on cluster)")


def test_ready_is_ready() -> None:
    assert karpenter.readiness(_node_pool([{"type": "Ready", "status": "True"}])).ok


def test_a_pod_over_the_gpu_limit_is_named_with_the_numbers() -> None:
    message = karpenter.limit_reached(_node_pool(limit="2", in_use="2"), pending_gpus=[1], placed_gpus=2)
    assert message and "NodePool tidegate-ns-p allows 2 GPU(s) and 2 are in use" in message


def test_a_pod_whose_node_is_still_launching_is_not_blamed_on_the_limit() -> None:
    # 2 GPUs counted, 1 taken: the other is a node launching for the pending pod.
    assert karpenter.limit_reached(_node_pool(limit="2", in_use="2"), pending_gpus=[1], placed_gpus=1) is None
    # Room left under the limit: Karpenter can still launch.
    assert karpenter.limit_reached(_node_pool(limit="4", in_use="2"), pending_gpus=[1], placed_gpus=2) is None
    assert karpenter.limit_reached(_node_pool(limit="2", in_use="2"), pending_gpus=[], placed_gpus=2) is None


def _event(uid: str, message: str, at_s: float) -> CoreV1Event:
    stamp = datetime.datetime.fromtimestamp(at_s, datetime.UTC)
    return CoreV1Event(
        metadata=V1ObjectMeta(name=f"e-{at_s}"),
        involved_object=V1ObjectReference(kind="Pod", uid=uid),
        message=message,
        last_timestamp=stamp,
    )


# Karpenter v1.14.1's FailedScheduling Event on a 16-GPU pod of pool "big" (kwok provider, GPU types
# of 1, 2 and 8 GPUs), as read on the local cluster; the second NodePool's error is as its
# scheduler joins them (multierr, "; ").
BIG = (
    "Failed to schedule pod, no instance type has enough resources, requirements=app.kubernetes.io/instance In "
    "[big], karpenter.kwok.sh/kwoknodeclass In [default], karpenter.sh/capacity-type In [on-demand], "
    "karpenter.sh/nodepool In [tidegate-ml-big], tidegate.dev/pool In [big], "
    'resources={"cpu":"250m","memory":"256Mi","nvidia.com/gpu":"16","pods":"1"}; incompatible requirements, '
    "key karpenter.sh/nodepool, karpenter.sh/nodepool In [tidegate-ml-big] not in karpenter.sh/nodepool In "
    "[tidegate-ml-other]"
)


def test_cannot_place_keeps_what_karpenter_says_of_the_pools_node_pool() -> None:
    says = karpenter.cannot_place([_event("u1", BIG, 10.0)])
    assert says == {
        "u1": 'no instance type has enough resources, resources={"cpu":"250m","memory":"256Mi",'
        '"nvidia.com/gpu":"16","pods":"1"}'
    }


def test_cannot_place_leaves_out_what_karpenter_says_of_another_node_pool() -> None:
    # the real Karpenter v1.14.1, for a pod of tidegate-nc-missing (its node class missing)
    other = (
        "Failed to schedule pod, all available instance types exceed limits for nodepool "
        "(NodePool=tidegate-lim-big8b); incompatible requirements, key karpenter.sh/nodepool, "
        "karpenter.sh/nodepool In [tidegate-nc-missing] not in karpenter.sh/nodepool In [tidegate-leak2-p]"
    )
    assert karpenter.cannot_place([_event("u1", other, 1.0)], "tidegate-nc-missing") == {}
    own = karpenter.cannot_place([_event("u1", other, 1.0)], "tidegate-lim-big8b")
    assert own == {"u1": "all available instance types exceed limits for nodepool (NodePool=tidegate-lim-big8b)"}


def test_cannot_place_takes_each_pods_latest_event() -> None:
    events = [_event("u1", "Failed to schedule pod, old", 5.0), _event("u1", BIG, 10.0), _event("u2", "x", 1.0)]
    says = karpenter.cannot_place(events)
    assert says["u1"].startswith("no instance type has enough resources") and says["u2"] == "x"


def test_node_registration_unhealthy_is_said_beside_ready() -> None:
    # Karpenter v1.14.1 keeps the NodePool Ready while its nodes fail to register (liveness.go).
    conditions = [
        {"type": "Ready", "status": "True"},
        {"type": "NodeRegistrationHealthy", "status": "False", "reason": "RegistrationFailed",
         "message": "Failed to register node"},
    ]  # fmt: skip
    verdict = karpenter.readiness(_node_pool(conditions))
    assert verdict.ok and verdict.reason == "Ready"
    assert verdict.message == (
        "NodePool tidegate-ns-p is Ready in Karpenter (1 node(s)), but NodeRegistrationHealthy=False "
        "(RegistrationFailed: Failed to register node): its nodes fail to launch or join the cluster"
    )
    healthy = [conditions[0], {**conditions[1], "status": "True"}]
    assert (
        karpenter.readiness(_node_pool(healthy)).message == "NodePool tidegate-ns-p is Ready in Karpenter (1 node(s))"
    )


# Karpenter v1.14.1's Warning on a NodePool whose requirements leave no instance type
# (pkg/controllers/provisioning/scheduling/events.go, NoCompatibleInstanceTypes).
MIN_VALUES = (
    "NodePool requirements filtered out all compatible available instance types due to minValues incompatibility"
)


def _np_event(uid: str, message: str, at_s: float) -> CoreV1Event:
    return CoreV1Event(
        metadata=V1ObjectMeta(name=f"np-{at_s}", namespace="default"),
        involved_object=V1ObjectReference(kind="NodePool", name="tidegate-ns-p", uid=uid),
        reason="NoCompatibleInstanceTypes",
        message=message,
        last_timestamp=datetime.datetime.fromtimestamp(at_s, datetime.UTC),
    )


def _live(uid: str = "np-1", changed_at: str = "1970-01-01T00:15:00Z") -> dict:
    # the operator stamped its template as changed at 900 s (builders.nodepool.stamp_template)
    meta = {"name": "tidegate-ns-p", "uid": uid, "annotations": {"tidegate.dev/template-changed-at": changed_at}}
    return {**_node_pool(), "metadata": meta}


def test_a_node_pool_whose_min_values_no_instance_type_meets_names_the_requirement_to_change() -> None:
    requirements = [
        {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["h100"]},
        {"key": "node.kubernetes.io/instance-type", "operator": "Exists", "minValues": 4},
    ]
    said = karpenter.filtered_out([_np_event("np-1", MIN_VALUES, 1000.0)], _live(), 1030.0, requirements)
    assert said is not None and said.startswith(MIN_VALUES)
    assert "(spec.nodePool.requirements[1] (node.kubernetes.io/instance-type minValues 4) asks for" in said
    assert "lower its minValues" in said
    assert "requirements[0]" not in said


def test_several_min_values_are_named_as_the_ones_of_which_some_cannot_be_met() -> None:
    requirements = [
        {"key": "node.kubernetes.io/instance-type", "operator": "Exists", "minValues": 2},
        {"key": "topology.kubernetes.io/zone", "operator": "Exists", "minValues": 2},
    ]
    said = karpenter.filtered_out([_np_event("np-1", MIN_VALUES, 1000.0)], _live(), 1000.0, requirements)
    assert said is not None
    assert "one or more of spec.nodePool.requirements[0] (node.kubernetes.io/instance-type minValues 2), " in said
    assert "lower their minValues" in said


def test_a_node_pool_whose_requirements_match_no_instance_type_says_so_without_min_values() -> None:
    plain = "NodePool requirements filtered out all compatible available instance types"
    said = karpenter.filtered_out([_np_event("np-1", plain, 1000.0)], _live(), 1000.0, [], ["reserved"])
    assert said is not None and said.startswith(plain + " (")
    assert "spec.nodePool.requirements entry and spec.nodePool.capacityTypes [reserved]" in said
    assert "minValues" not in said


def test_what_karpenter_no_longer_says_is_not_repeated() -> None:
    event = _np_event("np-1", MIN_VALUES, 1000.0)
    asked = [{"key": "node.kubernetes.io/instance-type", "operator": "Exists", "minValues": 4}]
    # Karpenter says it again every minute while the pods wait, every 5 minutes once client-go's spam
    # filter holds it back (after 25): not again for over 6 minutes, it stopped
    assert karpenter.filtered_out([event], _live(), 1360.0, asked) is not None
    assert karpenter.filtered_out([event], _live(), 1361.0, asked) is None
    # said before the template was last changed (requirements fixed, or changed to another mistake)
    assert karpenter.filtered_out([event], _live(changed_at="1970-01-01T00:16:41Z"), 1002.0, asked) is None
    # a word on minValues when the pool asks for none any more
    assert karpenter.filtered_out([event], _live(), 1002.0, []) is None
    # another NodePool of the same name (deleted and made again)
    assert karpenter.filtered_out([_np_event("np-0", MIN_VALUES, 1000.0)], _live("np-1"), 1000.0, asked) is None
    assert karpenter.filtered_out([], _live(), 1000.0, asked) is None
