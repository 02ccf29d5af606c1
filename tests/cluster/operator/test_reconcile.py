"""The operator against a real API server: children, warm-pool promotion, repair, cleanup, RBAC."""

import copy
import json
import time
from typing import Any

import kubernetes
import pytest
import yaml

from tests.cluster.conftest import new_namespace_name, wait_for
from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION, constants
from tidegate.operator.rbac import RULES

pytestmark = pytest.mark.usefixtures("operator")


def _pool(name: str, **spec: Any) -> dict[str, Any]:
    body = valid_pool(name)
    body["spec"].update(copy.deepcopy(spec))
    return body


def _create(api_client, namespace: str, body: dict[str, Any]) -> None:
    kubernetes.client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )


def _get_pool(api_client, namespace: str, name: str) -> dict[str, Any]:
    return kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )


def _roles(api_client, namespace: str, pool: str) -> dict[str, str]:
    pods = kubernetes.client.CoreV1Api(api_client).list_namespaced_pod(
        namespace, label_selector=f"{constants.LABEL_POOL}={pool}"
    )
    return {
        p.metadata.name: p.metadata.labels.get(constants.LABEL_ROLE)
        for p in pods.items
        if not p.metadata.deletion_timestamp
    }


def _count(roles: dict[str, str], role: str) -> int:
    return sum(1 for r in roles.values() if r == role)


def _condition(pool: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in pool.get("status", {}).get("conditions", []) if c["type"] == ctype), None)


def _wait_roles(api_client, ns: str, name: str, active: int, warm: int, timeout_s: float = 30) -> dict[str, str]:
    return wait_for(
        lambda: (
            (r := _roles(api_client, ns, name))
            and _count(r, "active") == active
            and _count(r, "warm") == warm
            and len(r) == active + warm
            and r
        ),
        timeout_s=timeout_s,
        what=f"exactly {active} active and {warm} warm pods of {ns}/{name}",
    )


def test_pool_becomes_a_sidecar_deployment_a_service_and_a_scaled_object(api_client, namespace: str) -> None:
    _create(api_client, namespace, _pool("p", replicas=2, warmPool={"size": 1}))
    _wait_roles(api_client, namespace, "p", active=2, warm=1)

    apps = kubernetes.client.AppsV1Api(api_client)
    dep = apps.read_namespaced_deployment("p", namespace)
    assert dep.spec.replicas == 3
    pod = dep.spec.template.spec
    assert [c.name for c in pod.containers] == ["model"]
    sidecar = pod.init_containers[-1]
    assert sidecar.name == "tidegate-admission" and sidecar.restart_policy == "Always"
    assert pod.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    assert dep.metadata.owner_references[0].kind == "InferencePool"

    svc = kubernetes.client.CoreV1Api(api_client).read_namespaced_service("p", namespace)
    assert svc.spec.selector == {constants.LABEL_POOL: "p", constants.LABEL_SERVING: "true"}

    so = kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        "keda.sh", "v1alpha1", namespace, "scaledobjects", "p"
    )
    assert so["spec"]["scaleTargetRef"] == {"apiVersion": "tidegate.dev/v1alpha1", "kind": "InferencePool", "name": "p"}
    assert so["spec"]["triggers"][0]["type"] == "external"

    # KedaReady: NotReconciled until the KEDA operator has acted on the ScaledObject (seconds; longer on
    # a loaded machine), then Applied, or NotReady once KEDA finds that the health server here serves
    # no external scaler
    pool = wait_for(
        lambda: (
            (p := _get_pool(api_client, namespace, "p"))
            and (_condition(p, "Ready") or {}).get("status") == "True"
            and (_condition(p, "KedaReady") or {}).get("reason") in ("Applied", "NotReady")
            and p["status"].get("warmReplicas") == 1  # the warm pod's readiness can reach the status a resync later
            and p
        ),
        what="Ready=True with 1 warm replica and KedaReady past NotReconciled",
    )
    assert pool["status"]["replicas"] == 2 and pool["status"]["warmReplicas"] == 1
    assert pool["status"]["selector"] == "tidegate.dev/pool=p"


def test_scale_up_promotes_warm_replicas_then_refills_the_warm_pool(api_client, kubectl, namespace: str) -> None:
    _create(api_client, namespace, _pool("s", replicas=1, warmPool={"size": 2}))
    before = _wait_roles(api_client, namespace, "s", active=1, warm=2)
    warm_before = {n for n, r in before.items() if r == "warm"}

    start = time.monotonic()
    kubectl("scale", "-n", namespace, "inferencepool", "s", "--replicas", "3")
    promoted = wait_for(
        lambda: (r := _roles(api_client, namespace, "s")) and _count(r, "active") == 3 and r, what="3 active pods"
    )
    latency_s = time.monotonic() - start
    # The two new active pods are the two that were warm (loaded), not new cold pods.
    assert warm_before <= {n for n, r in promoted.items() if r == "active"}
    _wait_roles(api_client, namespace, "s", active=3, warm=2)
    core = kubernetes.client.CoreV1Api(api_client)
    # The Event is posted after the relabel (and the promotion may take two reconciles when the
    # second warm pod's readiness lands a moment later): wait for the one that reaches 3.
    wait_for(
        lambda: any(
            e.message.startswith("promoted") and e.message.endswith("-> 3 active")
            for e in core.list_namespaced_event(namespace, field_selector="involvedObject.name=s").items
        ),
        what="an Event 'promoted ... -> 3 active'",
    )
    print(f"scale write -> 2 warm pods active: {latency_s:.2f} s")


def test_scale_down_drains_then_returns_pods_to_the_warm_pool(api_client, kubectl, namespace: str) -> None:
    _create(api_client, namespace, _pool("d", replicas=3, warmPool={"size": 1}))
    _wait_roles(api_client, namespace, "d", active=3, warm=1)
    core = kubernetes.client.CoreV1Api(api_client)
    since = core.list_namespaced_pod(namespace).metadata.resource_version
    kubectl("scale", "-n", namespace, "inferencepool", "d", "--replicas", "1")
    # Out of the Service at once (draining), then back to warm after the drain timeout (2 s). Every
    # label change is read from a watch: the 2 s of draining can fall between two polls of a loaded
    # API server (a clean-clone run polling every 0.2 s saw fewer than 2 at once for 30 s).
    drained: set[str] = set()
    watch = kubernetes.watch.Watch()
    for event in watch.stream(
        core.list_namespaced_pod,
        namespace,
        label_selector=f"{constants.LABEL_POOL}=d",
        resource_version=since,
        timeout_seconds=60,
    ):
        labels = event["object"].metadata.labels or {}
        if labels.get(constants.LABEL_ROLE) == "draining":
            drained.add(event["object"].metadata.name)
        if len(drained) == 2:
            watch.stop()
    assert len(drained) == 2, f"pods seen draining: {sorted(drained)}"
    _wait_roles(api_client, namespace, "d", active=1, warm=1)
    dep = kubernetes.client.AppsV1Api(api_client).read_namespaced_deployment("d", namespace)
    assert dep.spec.replicas == 2


def test_hand_edits_of_children_are_put_back(api_client, namespace: str) -> None:
    _create(api_client, namespace, _pool("e", replicas=1, warmPool={"size": 1}))
    core = kubernetes.client.CoreV1Api(api_client)
    apps = kubernetes.client.AppsV1Api(api_client)
    wait_for(lambda: _count(_roles(api_client, namespace, "e"), "active") == 1, what="1 active pod")
    core.patch_namespaced_service("e", namespace, {"spec": {"selector": {constants.LABEL_SERVING: "false"}}})
    apps.patch_namespaced_deployment("e", namespace, {"spec": {"replicas": 7}})
    wait_for(
        lambda: (
            core.read_namespaced_service("e", namespace).spec.selector.get(constants.LABEL_SERVING) == "true"
            and apps.read_namespaced_deployment("e", namespace).spec.replicas == 2
        ),
        what="Service selector and Deployment replicas put back",
    )


def test_deleted_children_are_recreated(api_client, namespace: str) -> None:
    _create(api_client, namespace, _pool("r"))
    core = kubernetes.client.CoreV1Api(api_client)
    wait_for(
        lambda: (
            core.list_namespaced_config_map(namespace, field_selector="metadata.name=r-admission").items
            and core.list_namespaced_service(namespace, field_selector="metadata.name=r").items
        ),
        what="ConfigMap and Service created",
    )
    core.delete_namespaced_config_map("r-admission", namespace)
    core.delete_namespaced_service("r", namespace)
    wait_for(
        lambda: (
            core.list_namespaced_config_map(namespace, field_selector="metadata.name=r-admission").items
            and core.list_namespaced_service(namespace, field_selector="metadata.name=r").items
        ),
        what="ConfigMap and Service recreated",
    )


def test_admission_changes_reach_the_config_map_without_restarting_pods(api_client, namespace: str) -> None:
    _create(api_client, namespace, _pool("c"))
    core = kubernetes.client.CoreV1Api(api_client)
    pods_before = wait_for(
        lambda: set(_roles(api_client, namespace, "c")) if len(_roles(api_client, namespace, "c")) == 2 else None,
        what="2 pods",
    )
    kubernetes.client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "c", {"spec": {"admission": {"maxConcurrency": 7}}}
    )

    def config() -> dict[str, Any]:
        return yaml.safe_load(core.read_namespaced_config_map("c-admission", namespace).data["config.yaml"])

    wait_for(lambda: config()["admission"].get("maxConcurrency") == 7, what="maxConcurrency 7 in the ConfigMap")
    assert set(_roles(api_client, namespace, "c")) == pods_before


def test_node_pool_is_created_validated_by_karpenter_and_deleted_with_the_pool(api_client, namespace: str) -> None:
    node_class = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"}
    body = _pool(
        "n", nodePool={"enabled": True, "nodeClassRef": node_class}, scaling={"maxReplicas": 4}, warmPool={"size": 1}
    )
    _create(api_client, namespace, body)
    custom = kubernetes.client.CustomObjectsApi(api_client)
    np_name = f"tidegate-{namespace}-n"

    def node_pool():
        try:
            return custom.get_cluster_custom_object("karpenter.sh", "v1", "nodepools", np_name)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    np = wait_for(node_pool, what=f"NodePool {np_name}")
    assert np["spec"]["limits"]["nvidia.com/gpu"] == (4 + 1 + 1) * 1
    assert np["spec"]["template"]["spec"]["nodeClassRef"] == node_class
    dep = wait_for(
        lambda: kubernetes.client.AppsV1Api(api_client).list_namespaced_deployment(namespace).items, what="Deployment"
    )
    assert dep[0].spec.template.spec.node_selector == {"karpenter.sh/nodepool": np_name}

    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "n")
    wait_for(lambda: node_pool() is None, what="NodePool deleted with the pool")
    wait_for(
        lambda: not kubernetes.client.AppsV1Api(api_client).list_namespaced_deployment(namespace).items,
        timeout_s=90,  # the garbage collector, busy with the namespaces earlier tests left, took > 30 s
        what="Deployment garbage-collected",
    )


def test_scaled_object_waits_for_a_reachable_scaler(api_client, namespace: str, scaler_health) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    scaler_health.serving(False)
    try:
        _create(api_client, namespace, _pool("k"))
        pool = wait_for(
            lambda: (p := _get_pool(api_client, namespace, "k")) and _condition(p, "KedaReady") and p,
            what="KedaReady condition",
        )
        assert _condition(pool, "KedaReady")["reason"] == "ScalerUnreachable"
        assert _condition(pool, "ScalerReachable")["status"] == "False"
        assert not custom.list_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects")["items"]
    finally:
        scaler_health.serving(True)
    wait_for(
        lambda: custom.list_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects")["items"],
        what="ScaledObject once the scaler answers",
    )


def test_restricted_namespace_admits_the_pool_pods(api_client, namespace: str) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    non_root = {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    server = {"image": "vllm/vllm-openai:v0.11.0", "securityContext": non_root}
    _create(api_client, namespace, _pool("rs", server=server))
    _wait_roles(api_client, namespace, "rs", active=1, warm=1)


def test_gpu_not_advertised_sets_degraded(api_client, namespace: str) -> None:
    _create(api_client, namespace, _pool("g", server={"image": "x", "gpus": 16}, warmPool={"size": 0}))
    pool = wait_for(
        lambda: (
            (p := _get_pool(api_client, namespace, "g"))
            and (_condition(p, "Degraded") or {}).get("status") == "True"
            and p
        ),
        what="Degraded=True",
        timeout_s=40,
    )
    assert "nvidia.com/gpu" in _condition(pool, "Degraded")["message"]


def test_two_pools_in_two_namespaces_are_isolated(api_client, kubectl, namespace: str) -> None:
    other = new_namespace_name()
    core = kubernetes.client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": other}})
    try:
        _create(api_client, namespace, _pool("same", replicas=1))
        _create(api_client, other, _pool("same", replicas=1))
        _wait_roles(api_client, namespace, "same", active=1, warm=1)
        _wait_roles(api_client, other, "same", active=1, warm=1)
        kubectl("scale", "-n", namespace, "inferencepool", "same", "--replicas", "2")
        _wait_roles(api_client, namespace, "same", active=2, warm=1)
        assert _count(_roles(api_client, other, "same"), "active") == 1
    finally:
        core.delete_namespace(other)


def test_operator_service_account_cannot_read_secrets(kubectl) -> None:
    sa = "system:serviceaccount:tidegate-system:tidegate-operator"
    assert kubectl("auth", "can-i", "get", "secrets", "--as", sa, "-A", check=False).stdout.strip() == "no"
    assert kubectl("auth", "can-i", "create", "pods", "--as", sa, "-A", check=False).stdout.strip() == "no"
    assert kubectl("auth", "can-i", "patch", "pods", "--as", sa, "-A").stdout.strip() == "yes"
    assert not any("secrets" in r["resources"] for r in RULES)
    assert json.dumps(RULES).count('"*"') == 0


def test_scale_above_max_replicas_is_held_at_max_and_reported(api_client, kubectl, namespace: str) -> None:
    _create(api_client, namespace, _pool("m", replicas=1, scaling={"maxReplicas": 2}, warmPool={"size": 1}))
    _wait_roles(api_client, namespace, "m", active=1, warm=1)
    kubectl("scale", "-n", namespace, "inferencepool", "m", "--replicas", "5")
    _wait_roles(api_client, namespace, "m", active=2, warm=1)
    pool = wait_for(
        lambda: (
            (p := _get_pool(api_client, namespace, "m"))
            and (_condition(p, "Degraded") or {}).get("status") == "True"
            and p
        ),
        what="Degraded=True",
    )
    assert "above scaling.maxReplicas 2: serving 2" in _condition(pool, "Degraded")["message"]


def test_the_scalers_decision_fills_status_signal_reject_rate_and_an_event(
    api_client, kubectl, namespace: str, scaler_decisions
) -> None:
    scaler_decisions.decisions[f"{namespace}/sig"] = {
        "current": 2,
        "desired": 4,
        "reason": "saturated",
        "text": "2 -> 4: capacity reject 31% across 5 tenants",
        "capacityRejectRate": 0.3125,
        "policyRejectRate": 0.02,
        "time": "2026-11-30T06:00:00+00:00",
    }
    _create(api_client, namespace, _pool("sig", replicas=2))
    pool = wait_for(
        lambda: (p := _get_pool(api_client, namespace, "sig")) and p.get("status", {}).get("signal") and p,
        what="status.signal",
    )
    assert pool["status"]["capacityRejectRate"] == 0.3125
    assert pool["status"]["signal"]["reason"] == "2 -> 4: capacity reject 31% across 5 tenants"
    assert kubectl("get", "-n", namespace, "tgpool", "sig").stdout.splitlines()[1].split()[5] == "0.3125"
    events = kubernetes.client.CoreV1Api(api_client).list_namespaced_event(
        namespace, field_selector="involvedObject.name=sig"
    )
    wait_for(
        lambda: (
            any("scaler: 2 -> 4: capacity reject 31%" in e.message for e in events.items)
            or any(
                "scaler: 2 -> 4" in e.message
                for e in kubernetes.client.CoreV1Api(api_client)
                .list_namespaced_event(namespace, field_selector="involvedObject.name=sig")
                .items
            )
        ),
        what="an Event with the scaler's decision",
    )
