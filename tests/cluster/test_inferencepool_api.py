"""The InferencePool CRD against a real kube-apiserver: refusals at apply time, /scale, columns."""

import ipaddress
import json
import os
import subprocess
import uuid

import kubernetes
import pytest
import yaml

from tests.cluster.conftest import CLUSTER_SH, wait_for
from tests.invalid_pools import CASES, Case, build, valid_pool
from tidegate.api import GROUP, PLURAL, VERSION
from tidegate.api.pool import InferencePool
from tidegate.operator.builders.nodepool import node_pool


def _create(api_client, namespace: str, body: dict) -> dict:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    return custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_invalid_pool_is_refused_at_create_naming_the_field(api_client, namespace: str, case: Case) -> None:
    with pytest.raises(kubernetes.client.ApiException) as info:
        _create(api_client, namespace, build(case, name=f"bad-{uuid.uuid4().hex[:6]}"))
    assert info.value.status in (400, 422), info.value.body
    message = json.loads(info.value.body)["message"]
    assert case.field in message, f"API server error does not name {case.field}: {message}"


def test_valid_pool_is_accepted_and_defaulted(api_client, namespace: str) -> None:
    created = _create(api_client, namespace, valid_pool("ok"))
    spec = created["spec"]
    assert spec["replicas"] == 1
    assert spec["warmPool"]["size"] == 1
    assert spec["admission"]["kvCache"] == {"enabled": True, "trip": 0.92, "resume": 0.85}
    assert spec["admission"]["circuitBreaker"]["maxCooldownSeconds"] == 300
    assert spec["nodePool"]["capacityTypes"] == ["on-demand"]


# Requirements and budgets Karpenter v1.14.1's NodePool takes: none may be refused at apply (nor break a
# stored pool: a CEL rule reading an absent `values` is an error on every later write, /scale included).
KARPENTER_TAKES = {
    "enabled": True,
    "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
    "requirements": [
        {"key": "example.com/gpu", "operator": "Exists"},
        {"key": "example.com/zone", "operator": "DoesNotExist"},
        {"key": "example.com/tier", "operator": "NotIn", "values": []},
        {"key": "example.com/rack", "operator": "Exists", "values": ["ignored"]},
        {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt", "values": ["0"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        {"key": "example.k8s.io/tier", "operator": "Exists"},
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        {"key": "karpenter.k8s.aws/instance-gpu-memory", "operator": "Gte", "values": ["80000"]},
        {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Lte", "values": ["8"]},
        {"key": "example.com/memory-bytes", "operator": "Gt", "values": ["1000000000000000000"]},
        {"key": "example.com/generation", "operator": "Lt", "values": ["0009"]},
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["a", "b", "c"], "minValues": 2},
    ],
    "limits": {"nvidia.com/gpu": "16", "cpu": "1500m", "memory": "64Gi"},
    "disruption": {
        "consolidationPolicy": "Balanced",
        "budgets": [
            {"nodes": "1", "reasons": ["Empty", "Drifted"]},
            {"nodes": "0", "schedule": "0 9 * * mon-fri", "duration": "8h"},
        ],
    },
}


def test_a_node_pool_spec_karpenter_takes_is_accepted_stays_scalable_and_its_node_pool_is_taken(
    api_client, namespace: str
) -> None:
    body = valid_pool("np")
    body["spec"]["nodePool"] = KARPENTER_TAKES
    created = _create(api_client, namespace, body)
    custom = kubernetes.client.CustomObjectsApi(api_client)
    custom.patch_namespaced_custom_object_scale(GROUP, VERSION, namespace, PLURAL, "np", {"spec": {"replicas": 2}})
    manifest = node_pool(InferencePool.model_validate(created))
    # the real Karpenter CRD's verdict on the NodePool the operator would write (dry run: nothing is made)
    custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", manifest, dry_run="All")


def test_partial_nested_objects_get_the_remaining_defaults(api_client, namespace: str) -> None:
    body = valid_pool("partial")
    body["spec"]["admission"] = {"kvCache": {"trip": 0.95}}
    created = _create(api_client, namespace, body)
    assert created["spec"]["admission"]["kvCache"] == {"enabled": True, "trip": 0.95, "resume": 0.85}
    # unset: each sidecar reads the budget from its model server (no number is written as a default)
    assert "tokenBudget" not in created["spec"]["admission"]
    assert created["spec"]["admission"]["adaptiveBudget"]["enabled"] is True


def test_kubectl_apply_minimal_example_and_scale_through_the_scale_subresource(kubectl, namespace: str) -> None:
    kubectl("apply", "-n", namespace, "-f", "examples/minimal.yaml")
    kubectl("scale", "-n", namespace, "inferencepool", "small", "--replicas", "3")
    spec = json.loads(kubectl("get", "-n", namespace, "tgpool", "small", "-o", "json").stdout)["spec"]
    assert spec["replicas"] == 3
    scale = json.loads(
        kubectl("get", "--raw", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/small/scale").stdout
    )
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3


def test_negative_scale_is_refused(kubectl, namespace: str) -> None:
    kubectl("apply", "-n", namespace, "-f", "examples/minimal.yaml")
    result = kubectl("scale", "-n", namespace, "inferencepool", "small", "--replicas", "-1", check=False)
    assert result.returncode != 0


def test_status_written_by_the_operator_is_kept_and_shown_in_columns(api_client, kubectl, namespace: str) -> None:
    _create(api_client, namespace, valid_pool("cols"))
    status = {
        "observedGeneration": 1,
        "replicas": 2,
        "readyReplicas": 2,
        "warmReplicas": 1,
        "selector": "tidegate.dev/pool=cols",
        "capacityRejectRate": 0.31,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Serving",
                "message": "2 active, 1 warm",
                "lastTransitionTime": "2026-11-30T00:00:00Z",
                "observedGeneration": 1,
            }
        ],
        "signal": {
            "desiredReplicas": 3,
            "capacityRejectRate": 0.31,
            "policyRejectRate": 0.02,
            "reason": "2 -> 3: capacity reject 31% across 5 tenants",
            "time": "2026-11-30T00:00:00Z",
        },
    }
    custom = kubernetes.client.CustomObjectsApi(api_client)
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "cols", {"status": status})
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "cols")["status"]
    assert stored == status, "the API server pruned status fields the operator writes"

    out = kubectl("get", "-n", namespace, "inferencepools").stdout.splitlines()
    assert out[0].split() == ["NAME", "MODEL", "DESIRED", "ACTIVE", "WARM", "REJECTRATE", "AGE"]
    row = out[1].split()
    assert row[:6] == ["cols", "Qwen/Qwen2.5-0.5B-Instruct", "1", "2", "1", "0.31"]
    # The HPA finds the pool's pods through /scale's selector.
    scale = json.loads(
        kubectl("get", "--raw", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/cols/scale").stdout
    )
    assert scale["status"] == {"replicas": 2, "selector": "tidegate.dev/pool=cols"}


def test_keda_and_karpenter_crds_are_installed_from_upstream(kubectl) -> None:
    crds = kubectl("get", "crd", "-o", "name").stdout.split()
    for name in (
        "scaledobjects.keda.sh",
        "scaledjobs.keda.sh",
        "triggerauthentications.keda.sh",
        "clustertriggerauthentications.keda.sh",
        "cloudeventsources.eventing.keda.sh",
        "clustercloudeventsources.eventing.keda.sh",
        "nodepools.karpenter.sh",
        "nodeclaims.karpenter.sh",
        "kwoknodeclasses.karpenter.kwok.sh",
    ):
        assert f"customresourcedefinition.apiextensions.k8s.io/{name}" in crds


def test_keda_and_karpenter_run_beside_the_cluster(kubectl, cluster_env) -> None:
    status = subprocess.run(
        [str(CLUSTER_SH), "status"], capture_output=True, text=True, env={**os.environ, **cluster_env}, check=True
    ).stdout
    assert "KEDA v2.21.0: up" in status and "Karpenter v1.14.1 (kwok provider): up" in status, status
    # The HPA controller reaches KEDA's metrics API server through the aggregated API.
    service = json.loads(kubectl("get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o", "json").stdout)
    available = next(c for c in service["status"]["conditions"] if c["type"] == "Available")
    assert available["status"] == "True", available
    assert (
        json.loads(kubectl("get", "--raw", "/apis/external.metrics.k8s.io/v1beta1").stdout)["kind"] == "APIResourceList"
    )


def test_fake_gpu_nodes_offer_gpus_and_the_restricted_namespace_exists(kubectl) -> None:
    # the static nodes of manifests/gpu-nodes.yaml (Karpenter launches GPU nodes of other sizes)
    static = "nvidia.com/gpu.present=true,!karpenter.sh/nodepool"
    nodes = yaml.safe_load(kubectl("get", "nodes", "-l", static, "-o", "yaml").stdout)["items"]
    assert len(nodes) >= 1
    for node in nodes:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    ns = yaml.safe_load(kubectl("get", "namespace", "tidegate-restricted", "-o", "yaml").stdout)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_pod_ips_are_loopback_so_nothing_leaves_this_machine(api_client, namespace: str) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "ip-probe"},
            "spec": {
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "c", "image": "registry.invalid/none"}],
            },
        },
    )
    ip = wait_for(lambda: core.read_namespaced_pod("ip-probe", namespace).status.pod_ip, what="a pod IP from kwok")
    assert ipaddress.ip_address(ip).is_loopback, ip
    # and in this cluster's own /16: another local cluster's pods never share an address with ours
    net = subprocess.run([str(CLUSTER_SH), "pod-net"], capture_output=True, text=True, check=True).stdout.strip()
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(f"{net}.0.0/16"), (ip, net)
