"""Consolidation vs do-not-disrupt: the real Karpenter v1.14.1 (kwok provider) never takes a node
from under a replica of the pool, warm or active, and still removes the nodes the pool left empty.

Each pool here asks for one GPU per replica on ``gpu-h100-1x`` nodes (one GPU each, through
``nodePool.requirements``), so every replica has a node of its own, and shortens Karpenter's
``consolidateAfter`` through ``spec.nodePool.disruption`` (the API allows any duration; 10m by
default).
"""

import datetime
import time

import kubernetes
import pytest

from tests.cluster.conftest import wait_for
from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION, constants

pytestmark = pytest.mark.usefixtures("operator")

NODE_CLASS = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"}  # made by cluster.sh
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
CONSOLIDATE_AFTER_S = 30


def _pool(name: str, replicas: int, warm: int, consolidate_after_s: int = CONSOLIDATE_AFTER_S) -> dict:
    body = valid_pool(name)
    body["spec"].update(
        replicas=replicas,
        server={"image": "vllm/vllm-openai:v0.11.0", "gpus": 1},
        scaling={"minReplicas": 1, "maxReplicas": 3, "keda": False},
        warmPool={"size": warm},
        nodePool={
            "enabled": True,
            "nodeClassRef": NODE_CLASS,
            "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["gpu-h100-1x"]}],
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": f"{consolidate_after_s}s"},
        },
    )
    return body


class Cluster:
    """Reads of one pool's pods, Karpenter nodes and NodeClaims."""

    def __init__(self, api_client, namespace: str, pool: str) -> None:
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.namespace, self.pool = namespace, pool
        self.node_pool = f"tidegate-{namespace}-{pool}"

    def pods(self) -> list[kubernetes.client.V1Pod]:
        items = self.core.list_namespaced_pod(self.namespace, label_selector=f"{constants.LABEL_POOL}={self.pool}")
        return [p for p in items.items if p.metadata.deletion_timestamp is None]

    def claims(self) -> list[dict]:
        selector = f"karpenter.sh/nodepool={self.node_pool}"
        return self.custom.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", label_selector=selector)[
            "items"
        ]

    def disrupted(self) -> list[str]:
        """NodeClaims being deleted, or nodes Karpenter has tainted for disruption."""
        out = [
            c["status"].get("nodeName", c["metadata"]["name"])
            for c in self.claims()
            if c["metadata"].get("deletionTimestamp")
        ]
        for node in self.core.list_node(label_selector=f"karpenter.sh/nodepool={self.node_pool}").items:
            if any(t.key == "karpenter.sh/disrupted" for t in node.spec.taints or []):
                out.append(node.metadata.name)
        return out

    def consolidatable_at(self, node: str, consolidate_after_s: int) -> float:
        """Epoch seconds at which Karpenter may consolidate ``node`` if no pod event comes: its NodeClaim's
        ``status.lastPodEventTime`` (one-second resolution) plus ``consolidate_after_s``."""
        claim = next(c for c in self.claims() if c.get("status", {}).get("nodeName") == node)
        stamp = claim["status"]["lastPodEventTime"]
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() + consolidate_after_s

    def status(self) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.pool).get(
            "status", {}
        )

    def delete(self) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.pool)
        wait_for(lambda: not self.claims(), timeout_s=120, interval_s=1, what="Karpenter's nodes gone with the pool")


def _placed_and_ready(c: Cluster, active: int, warm: int) -> bool:
    pods = c.pods()
    status = c.status()
    return (
        len(pods) == active + warm
        and all(p.spec.node_name for p in pods)
        and len({p.spec.node_name for p in pods}) == len(pods)
        and (status.get("readyReplicas"), status.get("warmReplicas")) == (active, warm)
    )


@pytest.mark.timeout(420)
def test_warm_and_active_replicas_carry_do_not_disrupt_and_karpenter_drift_leaves_their_nodes(
    api_client, namespace: str
) -> None:
    # Input: one active and one warm replica on two Karpenter nodes; then the NodePool's template
    # changes (an annotation: part of Karpenter's NodePool hash; its labels map is atomic, so the
    # operator's next apply would take a test label away), which makes Karpenter see both nodes
    # as drifted, a voluntary disruption it carries out by replacing the node and evicting its pods.
    # Expected: both pods carry karpenter.sh/do-not-disrupt, so Karpenter replaces neither node:
    # the warm replica keeps its loaded model (evicted, it would reload for minutes).
    custom = kubernetes.client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _pool("drift", replicas=1, warm=1))
    c = Cluster(api_client, namespace, "drift")
    try:
        wait_for(lambda: _placed_and_ready(c, 1, 1), timeout_s=150, interval_s=1, what="1 active + 1 warm, placed")
        pods = {p.metadata.name: p for p in c.pods()}
        roles = {n: p.metadata.labels[constants.LABEL_ROLE] for n, p in pods.items()}
        assert sorted(roles.values()) == [constants.ROLE_ACTIVE, constants.ROLE_WARM], roles
        claims = {cl["metadata"]["name"] for cl in c.claims()}

        custom.patch_cluster_custom_object(
            "karpenter.sh",
            "v1",
            "nodepools",
            c.node_pool,
            {"spec": {"template": {"metadata": {"annotations": {"test.tidegate.dev/drift": "1"}}}}},
        )

        def drifted() -> list[str]:
            return [
                cl["metadata"]["name"]
                for cl in c.claims()
                if any(
                    k["type"] == "Drifted" and k["status"] == "True" for k in cl.get("status", {}).get("conditions", [])
                )
            ]

        wait_for(lambda: len(drifted()) == 2, timeout_s=90, interval_s=1, what="Karpenter marks both nodes Drifted")
        since = time.monotonic()
        while time.monotonic() - since < 60:
            assert not c.disrupted(), f"Karpenter disrupts {c.disrupted()} under a do-not-disrupt replica"
            assert {p.metadata.name for p in c.pods()} == set(pods), "a replica was evicted"
            time.sleep(1)
        assert {cl["metadata"]["name"] for cl in c.claims()} >= claims
        for pod in c.pods():
            annotations = pod.metadata.annotations or {}
            assert annotations.get(DO_NOT_DISRUPT) == "true", (roles[pod.metadata.name], annotations)
    finally:
        c.delete()


@pytest.mark.timeout(420)
def test_a_node_the_warm_pool_left_empty_is_not_disrupted_once_a_serving_replica_lands_before_consolidate_after(
    api_client, namespace: str
) -> None:
    # Input: one active and one warm replica, each on its own node; the warm pool shrinks to 0,
    # leaving the warm replica's node empty; CONSOLIDATE_AFTER_S - LATE_S later the pool scales to 2
    # and the new replica lands on that empty node (the only free GPU in the NodePool).
    # Expected: Karpenter does not disrupt that node (nor the other) for the whole consolidateAfter
    # and beyond; the new replica, promoted to active, carries karpenter.sh/do-not-disrupt.
    late_s = 10
    custom = kubernetes.client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _pool("cons", replicas=1, warm=1))
    c = Cluster(api_client, namespace, "cons")
    try:
        wait_for(lambda: _placed_and_ready(c, 1, 1), timeout_s=150, interval_s=1, what="1 active + 1 warm, placed")
        pods = c.pods()
        warm = next(p for p in pods if p.metadata.labels[constants.LABEL_ROLE] == constants.ROLE_WARM)
        active = next(p for p in pods if p.metadata.labels[constants.LABEL_ROLE] == constants.ROLE_ACTIVE)
        empty_node = warm.spec.node_name

        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "cons", {"spec": {"warmPool": {"size": 0}}}
        )
        wait_for(
            lambda: not any(p.spec.node_name == empty_node for p in c.core.list_namespaced_pod(namespace).items),
            timeout_s=60,
            interval_s=0.5,
            what="the warm replica's node empty",
        )
        # consolidateAfter runs on Karpenter's clock: from the NodeClaim's status.lastPodEventTime, which
        # Karpenter sets when a pod binds or starts terminating but not again within 10 s of the last
        # set (podevents dedupeTimeout). A warm replica deleted within 10 s of binding leaves the time of
        # its binding, earlier than the test sees the node empty: counting from "empty" raced it.
        deadline = c.consolidatable_at(empty_node, CONSOLIDATE_AFTER_S)
        head_start_s = time.time() - (deadline - CONSOLIDATE_AFTER_S)
        while time.time() < deadline - late_s:
            assert not c.disrupted(), f"{c.disrupted()} disrupted before consolidateAfter"
            time.sleep(0.5)

        scaled = time.time()
        custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, namespace, PLURAL, "cons", {"spec": {"replicas": 2}}
        )
        landed = wait_for(
            lambda: next((p for p in c.pods() if p.metadata.name != active.metadata.name and p.spec.node_name), None),
            timeout_s=30,
            interval_s=0.5,
            what="the new replica placed",
        )
        landed_before_s = deadline - time.time()
        # If it did not land there, say how long the scale-up took to place a pod and how far from
        # consolidateAfter, and what the NodePool's nodes were then: a node of the pool made since, or the
        # empty one tainted for disruption, shows the replica came too late.
        nodes = [
            (n.metadata.name, f"{n.metadata.creation_timestamp:%H:%M:%S}", [t.key for t in n.spec.taints or []])
            for n in c.core.list_node(label_selector=f"karpenter.sh/nodepool={c.node_pool}").items
        ]
        assert landed.spec.node_name == empty_node, (
            f"placed {time.time() - scaled:.1f} s after the scale-up, {landed_before_s:.1f} s before consolidateAfter",
            nodes,
            landed.spec.node_name,
            empty_node,
        )

        since = time.monotonic()
        while time.monotonic() - since < CONSOLIDATE_AFTER_S + 45:
            assert not c.disrupted(), f"Karpenter disrupts {c.disrupted()} under a serving replica"
            assert {p.metadata.name for p in c.pods()} == {active.metadata.name, landed.metadata.name}
            time.sleep(1)
        promoted = c.core.read_namespaced_pod(landed.metadata.name, namespace)
        assert promoted.metadata.labels[constants.LABEL_ROLE] == constants.ROLE_ACTIVE
        assert (promoted.metadata.annotations or {}).get(DO_NOT_DISRUPT) == "true"
        print(
            f"\nnode {empty_node} got a replica {landed_before_s:.0f} s before consolidateAfter"
            f" (Karpenter's clock began {head_start_s:.0f} s before the node was seen empty), kept"
        )
    finally:
        c.delete()
