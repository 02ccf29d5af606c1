"""Two pools whose NodePool names collide never share, fight over or delete each other's NodePool.

Seen on the local cluster with the real Karpenter v1.14.1: ``team-a/llm`` and ``team/a-llm`` are both
``tidegate-team-a-llm``. The two operators' reconciles rewrote it in turn (its limit 4 <-> 14, its
labels flipping, generation 51 -> 84 in 40 s), and deleting ``team-a/llm`` deleted the NodePool the
other pool's only replica ran under, while that pool still said Ready.
"""

from typing import Any

from tests.invalid_pools import valid_pool
from tidegate.api.pool import InferencePool
from tidegate.operator import handlers, names, reconcile
from tidegate.operator.conditions import Integration
from tidegate.operator.failures import Reason


def _pool(namespace: str, name: str) -> InferencePool:
    body = valid_pool(name)
    body["metadata"]["namespace"] = namespace
    body["spec"]["nodePool"] = {
        "enabled": True,
        "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
    }
    return InferencePool.model_validate(body)


class _Kube:
    """One NodePool store: what ``_node_pool`` and the finalizer read, write and delete."""

    def __init__(self) -> None:
        self.node_pools: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []

    def has_api(self, *_: Any) -> bool:
        return True

    def get(self, _api: str, _kind: str, name: str, *_: Any) -> dict[str, Any] | None:
        return self.node_pools.get(name)

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.node_pools[manifest["metadata"]["name"]] = manifest
        return manifest

    def delete(self, _api: str, _kind: str, name: str, *_: Any) -> bool:
        self.deleted.append(name)
        return self.node_pools.pop(name, None) is not None


def test_the_second_pool_of_a_colliding_name_leaves_the_first_ones_node_pool_and_says_why() -> None:
    first, second = _pool("team-a", "llm"), _pool("team", "a-llm")
    assert names.node_pool_name(first) == names.node_pool_name(second) == "tidegate-team-a-llm"
    kube = _Kube()
    state, _, _, _ = reconcile._node_pool(kube, first, [], 0.0, 60.0)
    assert state is not Integration.NAME_TAKEN
    made = kube.node_pools["tidegate-team-a-llm"]

    state, message, _, _ = reconcile._node_pool(kube, second, [], 0.0, 60.0)
    assert state is Integration.NAME_TAKEN
    assert "belongs to pool team-a/llm" in message and "rename this pool" in message
    assert kube.node_pools["tidegate-team-a-llm"] is made  # not rewritten
    assert Reason.NODE_POOL_NAME_TAKEN == "NodePoolNameTaken"


def test_deleting_a_pool_never_deletes_another_pools_node_pool_of_the_same_name(monkeypatch) -> None:
    first, second = _pool("team-a", "llm"), _pool("team", "a-llm")
    kube = _Kube()
    reconcile._node_pool(kube, first, [], 0.0, 60.0)
    monkeypatch.setattr(handlers.STATE, "kube", kube, raising=False)
    handlers.pool_deleted(body=second.model_dump(by_alias=True, mode="json"))
    assert "tidegate-team-a-llm" in kube.node_pools
    handlers.pool_deleted(body=first.model_dump(by_alias=True, mode="json"))
    assert "tidegate-team-a-llm" not in kube.node_pools


def test_a_node_pool_made_before_the_namespace_label_is_still_the_pools_own() -> None:
    pool = _pool("team-a", "llm")
    old = {"metadata": {"labels": {"app.kubernetes.io/managed-by": "tidegate", "tidegate.dev/pool": "llm"}}}
    assert names.owns_node_pool(pool, old)
    by_hand = {"metadata": {"labels": {"tidegate.dev/pool": "llm"}}}
    assert not names.owns_node_pool(pool, by_hand)


def test_a_pool_stored_with_a_spec_this_version_refuses_still_loses_its_node_pool_on_delete(monkeypatch) -> None:
    """Seen on the real cluster: a pool stored before a validation rule existed (a NodePool schedule of
    six fields) stayed Terminating, its finalizer failing every minute on the model's refusal."""
    pool = _pool("team-a", "llm")
    kube = _Kube()
    reconcile._node_pool(kube, pool, [], 0.0, 60.0)
    body = pool.model_dump(by_alias=True, mode="json")
    body["spec"]["nodePool"]["disruption"]["budgets"] = [{"nodes": "1", "schedule": "0 0 * * * *", "duration": "1h"}]
    monkeypatch.setattr(handlers.STATE, "kube", kube, raising=False)
    handlers.pool_deleted(body=body)
    assert "tidegate-team-a-llm" not in kube.node_pools
