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
ONE_PER_NODE = {"labelSelector": {"matchLabels": {"app": "gpu"}}, "topologyKey": "kubernetes.io/hostname"}


def _condition(custom, namespace: str, pool: str, ctype: str) -> dict | None:
    body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, pool)
    return next((c for c in body.get("status", {}).get("conditions", []) if c["type"] == ctype), None)


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

        # The pool says why, with the numbers (Karpenter's own message on the pod names no limit).
        degraded = wait_for(
            lambda: (c := _condition(custom, namespace, "g", "Degraded")) and c["status"] == "True" and c,
            timeout_s=60,
            interval_s=1,
            what="Degraded=True on the pool",
        )
        assert (
            f"NodePool {np_name} allows 1 GPU(s) and 1 are in use, so Karpenter launches no node for a pod "
            "that needs 1 more" in degraded["message"]
        ), degraded
        assert degraded["reason"] == "NodePoolLimitReached"
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "g")
    # The operator's finalizer deletes the NodePool; Karpenter then removes its nodes.
    wait_for(
        lambda: not core.list_node(label_selector=f"karpenter.sh/nodepool={np_name}").items,
        timeout_s=90,
        interval_s=1,
        what="Karpenter's nodes gone with the NodePool",
    )


def test_empty_gpu_nodes_are_consolidated_one_at_a_time_under_the_default_budget(api_client, namespace: str) -> None:
    # The operator's NodePool, as built (default budget: one node, every reason). Built with
    # `reasons: []` it limited nothing: Karpenter emptied every node in one command.
    from tidegate.api.pool import InferencePool
    from tidegate.operator import builders

    body = valid_pool("c")
    body["metadata"]["namespace"] = namespace
    body["spec"].update(
        server={"image": "x", "gpus": 1},
        nodePool={"enabled": True, "nodeClassRef": NODE_CLASS, "disruption": {"consolidateAfter": "5s"}},
    )
    node_pool = builders.node_pool(InferencePool.model_validate(body))
    assert node_pool["spec"]["disruption"]["budgets"] == [{"nodes": "1"}]
    np_name = node_pool["metadata"]["name"]
    custom = kubernetes.client.CustomObjectsApi(api_client)
    apps = kubernetes.client.AppsV1Api(api_client)
    custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", node_pool)
    selector = f"karpenter.sh/nodepool={np_name}"

    def claims() -> list[dict]:
        return custom.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", label_selector=selector)["items"]

    try:
        apps.create_namespaced_deployment(
            namespace,
            {
                "metadata": {"name": "gpu"},
                "spec": {
                    "replicas": 3,
                    "selector": {"matchLabels": {"app": "gpu"}},
                    "template": {
                        "metadata": {"labels": {"app": "gpu"}},
                        "spec": {
                            "nodeSelector": {"karpenter.sh/nodepool": np_name},
                            "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                            "affinity": {
                                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [ONE_PER_NODE]}
                            },
                            "containers": [{"name": "c", "image": "x", "resources": {"limits": {GPU: "1"}}}],
                        },
                    },
                },
            },
        )
        core = kubernetes.client.CoreV1Api(api_client)
        wait_for(
            lambda: len([p for p in core.list_namespaced_pod(namespace).items if p.spec.node_name]) == 3,
            timeout_s=120,
            interval_s=1,
            what="three pods on three Karpenter nodes",
        )
        apps.patch_namespaced_deployment_scale("gpu", namespace, {"spec": {"replicas": 0}})
        # Three empty nodes; consolidation may remove them only one at a time.
        most_at_once = 0
        deadline = time.monotonic() + 240
        while (live := claims()) and time.monotonic() < deadline:
            most_at_once = max(most_at_once, sum(1 for c in live if c["metadata"].get("deletionTimestamp")))
            assert most_at_once <= 1, f"{most_at_once} nodes disrupted at once under a one-node budget"
            time.sleep(0.5)
        assert not claims(), "empty nodes were not consolidated within 240 s"
        assert most_at_once == 1
    finally:
        custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", np_name)
        wait_for(lambda: not claims(), timeout_s=90, interval_s=1, what="the NodePool's nodes gone")


def test_node_pool_ready_tells_what_karpenter_made_of_the_node_pool(api_client, namespace: str) -> None:
    # Three pools, each with its NodePool: a node class Karpenter serves, one it does not serve
    # (this Karpenter runs the kwok provider, not AWS), and a KWOKNodeClass that does not exist.
    custom = kubernetes.client.CustomObjectsApi(api_client)
    refs = {
        "served": NODE_CLASS,
        "foreign": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
        "missing": {**NODE_CLASS, "name": "no-such-class"},
    }
    for name, ref in refs.items():
        body = valid_pool(name)
        body["spec"].update(
            server={"image": "x", "gpus": 1},
            warmPool={"size": 0},
            nodePool={"enabled": True, "nodeClassRef": ref},
        )
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def node_pool_ready(name: str, status: str) -> dict | None:
        cond = _condition(custom, namespace, name, "NodePoolReady")
        return cond if cond and cond["status"] == status else None

    try:
        ready = wait_for(lambda: node_pool_ready("served", "True"), timeout_s=60, interval_s=1, what="served Ready")
        assert f"NodePool tidegate-{namespace}-served is Ready in Karpenter" in ready["message"]

        # NotReconciled (False) until Karpenter marks the NodePool, a moment after the operator applied it.
        missing = wait_for(
            lambda: (c := node_pool_ready("missing", "False")) and c["reason"] == "NotReady" and c,
            timeout_s=60,
            interval_s=1,
            what="missing: NotReady",
        )
        assert "NodeClassReady=False (NodeClassNotFound: NodeClass not found on cluster)" in missing["message"]

        foreign = wait_for(lambda: node_pool_ready("foreign", "False"), timeout_s=60, interval_s=1, what="foreign")
        assert foreign["reason"] == "NotReconciled"
        assert f"Karpenter has not reconciled NodePool tidegate-{namespace}-foreign" in foreign["message"]
        assert "EC2NodeClass default (karpenter.k8s.aws)" in foreign["message"]
        # Karpenter, which marked the other two within seconds, indeed leaves this one alone.
        np = custom.get_cluster_custom_object("karpenter.sh", "v1", "nodepools", f"tidegate-{namespace}-foreign")
        assert not np.get("status", {}).get("conditions")
    finally:
        for name in refs:
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        wait_for(
            lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
            timeout_s=60,
            what="the pools deleted (their NodePools with them)",
        )


# Karpenter's FailedScheduling message names one NodePool's incompatibility: with other tests'
# NodePools in the cluster it can name theirs ("... not in karpenter.sh/nodepool In [<another>]").
@pytest.mark.alone
def test_a_pod_no_instance_type_can_hold_degrades_the_pool_in_karpenters_words(api_client, namespace: str) -> None:
    # 16 GPUs per replica: the largest GPU instance type here has 8. The scheduler's own message only
    # says no node matches the NodePool's selector; Karpenter's FailedScheduling Event says why it
    # launches none.
    custom = kubernetes.client.CustomObjectsApi(api_client)
    body = valid_pool("big")
    body["spec"].update(
        server={"image": "vllm/vllm-openai:v0.11.0", "gpus": 16},
        warmPool={"size": 0},
        nodePool={"enabled": True, "nodeClassRef": NODE_CLASS},
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    try:
        degraded = wait_for(
            lambda: (
                (c := _condition(custom, namespace, "big", "Degraded")) and c["reason"] == "KarpenterCannotPlace" and c
            ),
            timeout_s=90,
            interval_s=1,
            what="Degraded=True KarpenterCannotPlace on the pool",
        )
        assert degraded["status"] == "True"
        assert "Karpenter launches no node for it: no instance type has enough resources" in degraded["message"]
        assert '"nvidia.com/gpu":"16"' in degraded["message"]
        assert "requirements=" not in degraded["message"]  # the long label list is left out
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "big")


def _one_gpu_pool(name: str, **node_pool: object) -> dict:
    """A pool of one 1-GPU replica, no warm pool, on its own NodePool with ``node_pool`` added."""
    body = valid_pool(name)
    body["spec"].update(
        server={"image": "vllm/vllm-openai:v0.11.0", "gpus": 1},
        warmPool={"size": 0},
        nodePool={"enabled": True, "nodeClassRef": NODE_CLASS, **node_pool},
    )
    return body


@pytest.mark.parametrize(
    ("requirement", "said", "field"),
    [
        (
            # Two instance types asked for, only one exists here: minValues 2 cannot be met.
            {"operator": "In", "values": ["gpu-h100-1x", "gpu-a100-1x"], "minValues": 2},
            "filtered out all compatible available instance types due to minValues incompatibility",
            "spec.nodePool.requirements[0] (node.kubernetes.io/instance-type minValues 2)",
        ),
        (
            {"operator": "In", "values": ["gpu-a100-1x"]},  # a type this cloud does not offer (a typo, say)
            "filtered out all compatible available instance types (",
            "spec.nodePool.requirements entry and spec.nodePool.capacityTypes",
        ),
    ],
    ids=["min-values", "no-such-type"],
)
def test_a_node_pool_whose_requirements_leave_no_instance_type_degrades_the_pool_naming_the_field(
    api_client, namespace: str, requirement: dict, said: str, field: str
) -> None:
    # Karpenter says this on the NodePool (a NoCompatibleInstanceTypes Warning); on the pod it says
    # at most "nodepool requirements filtered out all available instance types", and nothing at all
    # of this NodePool when other NodePools exist, so the pool would otherwise quote the scheduler.
    custom = kubernetes.client.CustomObjectsApi(api_client)
    name = "mv" if "minValues" in requirement else "typo"
    body = _one_gpu_pool(name, requirements=[{"key": "node.kubernetes.io/instance-type", **requirement}])
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    try:
        degraded = wait_for(
            lambda: (
                (c := _condition(custom, namespace, name, "Degraded")) and c["reason"] == "KarpenterCannotPlace" and c
            ),
            timeout_s=90,
            interval_s=1,
            what="Degraded=True KarpenterCannotPlace on the pool",
        )
        assert "Karpenter launches no node for it: NodePool requirements " + said in degraded["message"]
        assert field in degraded["message"]
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def test_once_the_requirements_are_changed_the_pool_no_longer_says_karpenters_word_on_the_old_ones(
    api_client, namespace: str
) -> None:
    # An instance type this cloud does not offer, then one it offers that the NodePool's limit does not
    # let Karpenter launch (8 GPUs, limit 4): the pod stays Pending for that other reason. Karpenter's
    # word on the first mistake stays on the NodePool (the API server keeps Events an hour) and on the
    # pod (Karpenter tells a pod at most once in 5 minutes): neither is what the pool says once the
    # requirements changed; the scheduler's words are, until Karpenter speaks again.
    custom = kubernetes.client.CustomObjectsApi(api_client)
    body = _one_gpu_pool(
        "fix",
        limits={GPU: "4"},
        requirements=[{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["gpu-h100-1X"]}],
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def degraded() -> dict:
        return _condition(custom, namespace, "fix", "Degraded") or {}

    try:
        wait_for(
            lambda: (
                degraded().get("reason") == "KarpenterCannotPlace"
                and "filtered out all compatible available instance types" in degraded()["message"]
            ),
            timeout_s=90,
            interval_s=1,
            what="KarpenterCannotPlace in the NodePool's words",
        )
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            "fix",
            {"spec": {"nodePool": {"requirements": [
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["gpu-h100-8x"]}
            ]}}},
        )  # fmt: skip
        now = wait_for(
            lambda: (c := degraded()) and "filtered out" not in c["message"] and c,
            timeout_s=30,
            interval_s=1,
            what="the pool without Karpenter's word on the old requirements",
        )
        assert now["status"] == "True" and now["reason"] in ("Unschedulable", "KarpenterCannotPlace"), now
        print(f"\nafter the fix: {now['reason']}: {now['message']}")
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "fix")
