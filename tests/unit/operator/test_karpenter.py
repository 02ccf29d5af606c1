"""What Karpenter writes on a NodePool, as the pool's conditions say it (pure part)."""

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
