"""The real Karpenter provisions GPU nodes for a pool's NodePool.

Karpenter v1.14.1 with its kwok provider runs beside the local control plane
(e2e/cluster/cluster.sh), with the GPU instance types of e2e/cluster/manifests/gpu-instance-types.json
(H100 types with 1, 2 and 8 ``nvidia.com/gpu``). The operator writes the NodePool and the
Deployment; Karpenter launches (fake, kwok-run) nodes for the pods it cannot place elsewhere.
"""

import time

import kubernetes
import pytest

from tests.cluster.conftest import wait_for
from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION, constants

pytestmark = pytest.mark.usefixtures("operator")

NODE_CLASS = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"}  # made by cluster.sh
GPU = "nvidia.com/gpu"


def _pending_and_placed(core, namespace: str, pool: str) -> tuple[list, list]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"{constants.LABEL_POOL}={pool}").items
    pods = [p for p in pods if p.metadata.deletion_timestamp is None]
    return [p for p in pods if not p.spec.node_name], [p for p in pods if p.spec.node_name]


def test_karpenter_launches_a_gpu_node_for_the_pool_and_holds_the_gpu_limit(api_client, namespace: str) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    custom = kubernetes.client.CustomObjectsApi(api_client)
    body = valid_pool("g")
    body["spec"].update(
        replicas=1,
        server={"image": "vllm/vllm-openai:v0.11.0", "gpus": 1},
        scaling={"minReplicas": 1, "maxReplicas": 2},
        warmPool={"size": 0},
        nodePool={"enabled": True, "nodeClassRef": NODE_CLASS, "limits": {GPU: "1"}},
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    np_name = f"tidegate-{namespace}-g"
    try:
        # The pod of the operator's Deployment selects the NodePool's nodes: only Karpenter can place it.
        placed = wait_for(
            lambda: _pending_and_placed(core, namespace, "g")[1],
            timeout_s=90,
            interval_s=1,
            what="the pool's pod on a node Karpenter launched",
        )
        node = core.read_node(placed[0].spec.node_name)
        labels = node.metadata.labels
        assert labels["karpenter.sh/nodepool"] == np_name
        assert labels["karpenter.k8s.aws/instance-gpu-name"] == "h100"  # the NodePool's GPU requirement can filter
        assert labels["node.kubernetes.io/instance-type"] == "gpu-h100-1x"  # the cheapest type that fits one GPU
        assert node.status.allocatable[GPU] == "1"
        assert any(t.key == GPU and t.effect == "NoSchedule" for t in node.spec.taints or [])

        # A second replica would need a second GPU: the NodePool's limit (1) forbids it.
        custom.patch_namespaced_custom_object_scale(GROUP, VERSION, namespace, PLURAL, "g", {"spec": {"replicas": 2}})
        wait_for(
            lambda: _pending_and_placed(core, namespace, "g")[0],
            timeout_s=60,
            interval_s=1,
            what="a second pod, pending",
        )

        def claims() -> list[str]:
            items = custom.list_cluster_custom_object(
                "karpenter.sh", "v1", "nodeclaims", label_selector=f"karpenter.sh/nodepool={np_name}"
            )["items"]
            return [c["metadata"]["name"] for c in items]

        # Karpenter batches pending pods for up to 10 s (BATCH_MAX_DURATION) before it decides:
        # watch twice that long for a second node.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert len(claims()) == 1, f"a second node over the NodePool's {GPU} limit: {claims()}"
            time.sleep(1)
        pending, placed = _pending_and_placed(core, namespace, "g")
        assert len(pending) == 1 and len(placed) == 1
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "g")
    # The operator's finalizer deletes the NodePool; Karpenter then removes its nodes.
    wait_for(
        lambda: not core.list_node(label_selector=f"karpenter.sh/nodepool={np_name}").items,
        timeout_s=90,
        interval_s=1,
        what="Karpenter's nodes gone with the NodePool",
    )
