"""GPU never advertised: Karpenter launches a GPU node for the pool, but the node never
advertises ``nvidia.com/gpu`` (the NVIDIA device plugin is not running on it).

Karpenter v1.14.1's kwok provider gives its nodes the instance type's resources, so the test
plays the missing device plugin itself: the pool's NodePool carries a startup taint (Karpenter
puts it on each new node; in the field a GPU operator removes such a taint once its stack is
up), and while it holds no pod can land, the test takes ``nvidia.com/gpu`` out of the node's
capacity and allocatable, then lifts the taint, as a node whose device plugin never registered.

Input: pool ``nogpu``, 1 active replica and a warm pool of 1, each replica asking for one GPU,
its NodePool served by the real Karpenter.

Expected: Karpenter launches GPU node(s) for the two pods (by instance type, one GPU per pod);
they come up without the GPU, the scheduler cannot place the pods ("Insufficient nvidia.com/gpu"),
and the pool says so: ``Degraded=True`` with the scheduler's words and a hint at the device
plugin; no replica counts as ready or warm (``readyReplicas``, ``warmReplicas`` stay 0,
``Ready=False``). Karpenter launches nothing more: it waits for the node to initialise.
"""

import time

import kubernetes
import pytest

from tests.cluster.conftest import wait_for
from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION, constants
from tidegate.api.pool import InferencePool
from tidegate.operator import builders

pytestmark = pytest.mark.usefixtures("operator")

NODE_CLASS = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"}  # made by cluster.sh
GPU = "nvidia.com/gpu"
STARTUP_TAINT = {"key": "test.tidegate.dev/device-plugin", "value": "starting", "effect": "NoSchedule"}
HELD_S = 20  # pods watched Pending after the nodes came up without their GPU


def _condition(pool: dict, ctype: str) -> dict:
    return next((c for c in pool.get("status", {}).get("conditions", []) if c["type"] == ctype), {})


@pytest.mark.timeout(420)
def test_a_karpenter_node_without_its_gpu_degrades_the_pool_and_is_never_warm_capacity(
    api_client, namespace: str
) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    custom = kubernetes.client.CustomObjectsApi(api_client)
    body = valid_pool("nogpu")
    body["spec"].update(
        replicas=1,
        server={"image": "vllm/vllm-openai:v0.11.0", "gpus": 1},
        scaling={"minReplicas": 1, "maxReplicas": 2, "keda": False},
        warmPool={"size": 1},
        nodePool={"enabled": True, "nodeClassRef": NODE_CLASS},
    )
    # The NodePool the operator will write, made first with the startup taint (under this test's
    # field manager, so the operator's server-side apply keeps it).
    node_pool = builders.node_pool(
        InferencePool.model_validate({**body, "metadata": {**body["metadata"], "namespace": namespace}})
    )
    np_name = node_pool["metadata"]["name"]
    node_pool["spec"]["template"]["spec"]["startupTaints"] = [STARTUP_TAINT]
    custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", node_pool)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def pool() -> dict:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "nogpu")

    def nodes() -> list[kubernetes.client.V1Node]:
        return core.list_node(label_selector=f"karpenter.sh/nodepool={np_name}").items

    def pods() -> list[kubernetes.client.V1Pod]:
        items = core.list_namespaced_pod(namespace, label_selector=f"{constants.LABEL_POOL}=nogpu").items
        return [p for p in items if p.metadata.deletion_timestamp is None]

    stripped: set[str] = set()

    def without_gpu(node: kubernetes.client.V1Node) -> bool:
        return GPU not in (node.status.allocatable or {}) and GPU not in (node.status.capacity or {})

    try:
        # Karpenter launches node(s) for the two pods; each comes up with the startup taint. The
        # device plugin never starts there: the node loses its GPU before any pod can land.
        def gpu_less_nodes_for_every_pod() -> bool:
            for node in nodes():
                name = node.metadata.name
                taints = node.spec.taints or []
                if name in stripped or not any(t.key == STARTUP_TAINT["key"] for t in taints):
                    continue
                if not any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []):
                    continue
                assert not any(p.spec.node_name == name for p in pods()), "a pod landed under the startup taint"
                core.patch_node_status(name, {"status": {"capacity": {GPU: None}, "allocatable": {GPU: None}}})
                kept = [api_client.sanitize_for_serialization(t) for t in taints if t.key != STARTUP_TAINT["key"]]
                core.patch_node(name, {"spec": {"taints": kept}})
                stripped.add(name)
            launched = {n.metadata.name: n for n in nodes()}
            gpus = sum(
                int(n.metadata.labels.get("karpenter.k8s.aws/instance-gpu-count", "0")) for n in launched.values()
            )
            return launched and set(launched) == stripped and gpus >= 2

        wait_for(gpu_less_nodes_for_every_pod, timeout_s=120, interval_s=0.5, what="Karpenter's nodes, GPU stripped")
        for node in nodes():
            assert without_gpu(node), node.status.allocatable
            assert node.metadata.labels["karpenter.k8s.aws/instance-gpu-name"] == "h100"  # a GPU type, by its labels

        # The pool says why its replicas wait, and counts none of them.
        # (Degraded=True may come earlier, while the startup taint holds the pods: it must come to name the GPU.)
        degraded = wait_for(
            lambda: (
                (c := _condition(pool(), "Degraded"))
                and c["status"] == "True"
                and f"Insufficient {GPU}" in c["message"]
                and c
            ),
            timeout_s=60,
            interval_s=1,
            what=f"Degraded=True naming {GPU}",
        )
        print(f"\nDegraded: {degraded['message']}")
        assert "device plugin" in degraded["message"], degraded
        launched = {n.metadata.name for n in nodes()}
        since = time.monotonic()
        while time.monotonic() - since < HELD_S:
            assert {n.metadata.name for n in nodes()} == launched, "Karpenter launched more nodes"
            status = pool()["status"]
            assert (status.get("readyReplicas"), status.get("warmReplicas")) == (0, 0), status
            assert all(not p.spec.node_name for p in pods()), "a pod was placed on a node without a GPU"
            for node in nodes():
                assert without_gpu(node), f"{node.metadata.name} advertises a GPU again"
            time.sleep(1)
        assert _condition(pool(), "Ready")["status"] == "False"
        waiting = [
            c.message for p in pods() for c in p.status.conditions or [] if c.type == "PodScheduled" and c.message
        ]
        print(f"pods: {waiting}")
        assert len(pods()) == 2 and all(f"Insufficient {GPU}" in m for m in waiting), waiting
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "nogpu")
        # The operator's finalizer deletes the NodePool; Karpenter then removes its nodes.
        wait_for(lambda: not nodes(), timeout_s=120, interval_s=1, what="Karpenter's nodes gone with the NodePool")
