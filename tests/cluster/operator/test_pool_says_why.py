"""A pool that cannot come up says why, in `kubectl apply` or on the pool (issue 14 items 1-3).

Names that can never be a Service name are refused at apply time with what is allowed; what the
API server still refuses, and pods the cluster will not create, schedule or start, end up in the
pool's Degraded condition and a Warning Event in the refusing component's own words; a pool
applied below its minReplicas serves minReplicas and says so.
"""

import copy
import json
import pathlib
import urllib.request
from typing import Any

import kubernetes
import pytest

from tests.cluster.conftest import wait_for
from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.usefixtures("operator")

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"
# A loaded machine: the Deployment and ReplicaSet controllers, then a reconcile, then the status write.
DEADLINE_S = 60


def _pool(name: str, **spec: Any) -> dict[str, Any]:
    body = valid_pool(name)
    body["spec"].update(copy.deepcopy(spec))
    return body


def _create(api_client, namespace: str, body: dict[str, Any]) -> None:
    kubernetes.client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )


def _condition(api_client, namespace: str, name: str, ctype: str) -> dict[str, Any]:
    pool = kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return next((c for c in pool.get("status", {}).get("conditions", []) if c["type"] == ctype), {})


def _degraded_with(api_client, namespace: str, name: str, *words: str) -> dict[str, Any]:
    return wait_for(
        lambda: (
            (c := _condition(api_client, namespace, name, "Degraded"))
            and c["status"] == "True"
            and all(w in c["message"] for w in words)
            and c
        ),
        timeout_s=DEADLINE_S,
        what=f"Degraded=True on {namespace}/{name} saying {words}",
    )


def _warning_events(api_client, namespace: str, name: str) -> list[kubernetes.client.CoreV1Event]:
    events = kubernetes.client.CoreV1Api(api_client).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},involvedObject.kind=InferencePool"
    )
    return [e for e in events.items if e.type == "Warning"]


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("llama-3.1-8b", "no dots; try llama-3-1-8b"),
        ("8b-llama", "it must start with a letter; try pool-8b-llama"),
        ("a" * 55, "at most 54 characters"),
    ],
    ids=["dots", "leading-digit", "55-characters"],
)
def test_a_name_that_cannot_be_a_service_name_is_refused_at_apply_saying_what_is_allowed(
    kubectl, namespace: str, name: str, says: str
) -> None:
    manifest = (EXAMPLES / "minimal.yaml").read_text().replace("name: small", f"name: {name}")
    result = kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest, check=False)
    assert result.returncode != 0, f"{name!r} was accepted: {result.stdout}"
    assert "metadata.name" in result.stderr and says in result.stderr, result.stderr
    assert "lowercase letters, digits and '-'" in result.stderr


def test_a_name_with_a_capital_is_refused_by_the_api_server_without_a_wrong_hint(kubectl, namespace: str) -> None:
    # Capitals fail the API server's own DNS-1123 check; tidegate's rules must not add a wrong
    # "it must start with a letter; try pool-Llama-8b" (a fresh user met that: it starts with one).
    manifest = (EXAMPLES / "minimal.yaml").read_text().replace("name: small", "name: Llama-8b")
    result = kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest, check=False)
    assert result.returncode != 0, result.stdout
    assert "RFC 1123" in result.stderr, result.stderr
    assert "start with a letter" not in result.stderr and "try pool-" not in result.stderr, result.stderr


def test_a_54_character_name_is_accepted_and_every_child_made_from_it_is_too(api_client, namespace: str) -> None:
    # The longest allowed: KEDA's webhook refuses a ScaledObject whose HPA keda-hpa-<name> is over 63.
    name = "l" + "-x" * 26 + "z"  # 54 characters
    _create(api_client, namespace, _pool(name, warmPool={"size": 0}))
    wait_for(
        lambda: _condition(api_client, namespace, name, "Ready").get("status") == "True",
        timeout_s=DEADLINE_S,
        what="the 54-character pool Ready",
    )
    assert _condition(api_client, namespace, name, "Degraded")["status"] == "False"
    kubernetes.client.CoreV1Api(api_client).read_namespaced_service(name, namespace)
    kubernetes.client.CoreV1Api(api_client).read_namespaced_config_map(f"{name}-admission", namespace)
    # KEDA's webhook accepted the ScaledObject: its HPA keda-hpa-<name> is 63 characters. (The health
    # server here serves no external scaler, so KEDA may already report it not Ready: NotReady.)
    assert _condition(api_client, namespace, name, "KedaReady")["reason"] in ("Applied", "NotReady")
    kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        "keda.sh", "v1alpha1", namespace, "scaledobjects", name
    )


def test_a_child_the_api_server_refuses_degrades_the_pool_with_its_message_and_a_warning_event(
    api_client, namespace: str
) -> None:
    # A volume mount of a volume the pod does not declare: the CRD cannot check it, the
    # Deployment's validation refuses it.
    server = {"image": "vllm/vllm-openai:v0.11.0", "volumeMounts": [{"name": "weights", "mountPath": "/models"}]}
    _create(api_client, namespace, _pool("vm", server=server))
    degraded = _degraded_with(api_client, namespace, "vm", "refused Deployment vm", 'Not found: "weights"')
    assert "volumeMounts[0].name" in degraded["message"]
    assert degraded["reason"] == "ApiRefused"
    # The rest of the pool was still made and the status still written.
    kubernetes.client.CoreV1Api(api_client).read_namespaced_service("vm", namespace)
    assert _condition(api_client, namespace, "vm", "Ready")["status"] == "False"
    events = wait_for(
        lambda: [e for e in _warning_events(api_client, namespace, "vm") if 'Not found: "weights"' in e.message],
        timeout_s=DEADLINE_S,
        what="a Warning Event with the API server's message",
    )
    assert events[0].reason == "ApiRefused"
    # One Event per new reason, not one per retry.
    assert len(events) == 1 and (events[0].count or 1) == 1

    # Fixed spec: the pool comes up and Degraded clears.
    kubernetes.client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "vm", {"spec": {"server": {"volumeMounts": []}}}
    )
    wait_for(
        lambda: _condition(api_client, namespace, "vm", "Degraded").get("status") == "False",
        timeout_s=DEADLINE_S,
        what="Degraded=False once the spec is fixed",
    )


def _operator_metrics(env: dict[str, str]) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{env['TIDEGATE_METRICS_PORT']}/metrics", timeout=5) as resp:
        return resp.read().decode()


def test_pods_refused_by_pod_security_degrade_the_pool_with_the_replicasets_message(
    api_client, kubectl, namespace: str, operator: dict[str, str]
) -> None:
    # The namespace the cluster calls tidegate-restricted, made per test: Pod Security `restricted`.
    kubernetes.client.CoreV1Api(api_client).patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "minimal.yaml"))
    degraded = _degraded_with(api_client, namespace, "small", "FailedCreate", 'violates PodSecurity "restricted')
    assert "Deployment small cannot create pods" in degraded["message"]
    assert degraded["reason"] == "PodCreateFailed"
    assert _condition(api_client, namespace, "small", "Ready")["status"] == "False"
    wait_for(
        lambda: any("PodSecurity" in e.message for e in _warning_events(api_client, namespace, "small")),
        timeout_s=DEADLINE_S,
        what="a Warning Event naming PodSecurity",
    )
    described = kubectl("describe", "tgpool", "small", "-n", namespace).stdout
    assert 'violates PodSecurity "restricted' in described
    # What an alert reads: the operator's /metrics has the pool Degraded now.
    degraded_now = f'tidegate_pool_condition{{namespace="{namespace}",pool="small",status="True",type="Degraded"}} 1.0'
    assert degraded_now in _operator_metrics(operator)


def test_pods_over_a_resource_quota_degrade_the_pool_with_the_quota_message(
    api_client, kubectl, namespace: str
) -> None:
    kubectl("create", "quota", "one-pod", "-n", namespace, "--hard=pods=1")
    _create(api_client, namespace, _pool("q", replicas=1, warmPool={"size": 1}))
    _degraded_with(api_client, namespace, "q", "FailedCreate", "exceeded quota: one-pod")


def test_pods_no_node_can_take_degrade_the_pool_with_the_schedulers_reason(api_client, namespace: str) -> None:
    server = {"image": "vllm/vllm-openai:v0.11.0", "nodeSelector": {"example.com/accelerator": "tpu-v9"}}
    _create(api_client, namespace, _pool("ns", server=server, warmPool={"size": 0}))
    degraded = _degraded_with(api_client, namespace, "ns", "Pending for over", "the scheduler says")
    assert "node(s) didn't match Pod's node affinity/selector" in degraded["message"]
    assert degraded["reason"] == "Unschedulable"


def test_a_pool_applied_below_min_replicas_serves_min_replicas_and_says_so(api_client, namespace: str) -> None:
    # No autoscaler writes spec.replicas here: the pool was applied with the default 1 under minReplicas 2.
    _create(api_client, namespace, _pool("lo", replicas=1, scaling={"minReplicas": 2}, warmPool={"size": 0}))
    ready = wait_for(
        lambda: (c := _condition(api_client, namespace, "lo", "Ready")) and c["status"] == "True" and c,
        timeout_s=DEADLINE_S,
        what="Ready=True",
    )
    assert ready["message"].startswith("2/2 active ready")
    assert "spec.replicas 1 is below scaling.minReplicas 2: serving 2" in ready["message"]
    pool = kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "lo"
    )
    assert pool["status"]["readyReplicas"] == 2
    assert json.dumps(pool["spec"]["replicas"]) == "1"  # the operator never writes spec


def test_replicas_up_behind_a_service_the_api_server_refused_are_not_ready(api_client, kubectl, namespace: str) -> None:
    # A quota that allows no Service: the pod comes up, but no request can reach it.
    kubectl("create", "quota", "no-services", "-n", namespace, "--hard=services=0")
    _create(api_client, namespace, _pool("nosvc", replicas=1, warmPool={"size": 0}))
    ready = wait_for(
        lambda: (
            (c := _condition(api_client, namespace, "nosvc", "Ready"))
            and c["reason"] == "NoService"
            and c["message"].startswith("1/1 active ready")
            and c
        ),
        timeout_s=DEADLINE_S,
        what="Ready=False NoService with the replica ready",
    )
    assert ready["status"] == "False"
    assert "refused Service nosvc" in ready["message"] and "exceeded quota: no-services" in ready["message"]
    assert _degraded_with(api_client, namespace, "nosvc", "refused Service nosvc")["reason"] == "ApiRefused"

    # The quota lifted: the Service is made and the pool is Ready.
    kubectl("delete", "quota", "no-services", "-n", namespace)
    wait_for(
        lambda: _condition(api_client, namespace, "nosvc", "Ready").get("reason") == "Serving",
        timeout_s=DEADLINE_S,
        what="Ready=True once the Service exists",
    )
    kubernetes.client.CoreV1Api(api_client).read_namespaced_service("nosvc", namespace)
