"""Every example is accepted by the real API server and reconciled by the real operator.

Each InferencePool example is applied as written (the API server's schema and CEL rules judge it),
then a `tidegate operator` watching only that test's namespace must turn it into its children
(Deployment, Service, ConfigMap, PDB, ScaledObject: each accepted by the API server) and write its
status. The namespace gets a ResourceQuota of zero GPUs, so the examples' pods are refused and
never take GPUs from the shared cluster's other tests: readiness of pods is not judged here
(tests/cluster/operator does that), but the pool must say why it has none (Degraded, quoting the
quota refusal).

The GitOps examples: their pools folder is applied with `kubectl apply -k` (what Argo CD and Flux
would sync); Argo CD's Application and Flux's objects need those projects' CRDs, which this cluster
does not have, so tests/unit/chart/test_examples.py checks them.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from tests.cluster.conftest import wait_for

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"
FILES = ["minimal.yaml", "vllm.yaml", "llamacpp.yaml", "tgi.yaml", "multi-tenant.yaml"]


def _pools_in(path: pathlib.Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "InferencePool"]


def _get(kubectl, namespace: str, *what: str) -> dict | None:
    result = kubectl("get", *what, "-n", namespace, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def _condition(pool: dict, ctype: str) -> str | None:
    return next((c["status"] for c in pool.get("status", {}).get("conditions", []) if c["type"] == ctype), None)


def _reason(pool: dict, ctype: str) -> str:
    return next((c["reason"] for c in pool.get("status", {}).get("conditions", []) if c["type"] == ctype), "")


def _message(pool: dict, ctype: str) -> str:
    return next((c["message"] for c in pool.get("status", {}).get("conditions", []) if c["type"] == ctype), "")


@pytest.fixture
def operator(cluster_env, kubectl, namespace, tmp_path):
    """`tidegate operator -n <namespace>`; on teardown the pools are deleted while it still runs (finalizers)."""
    env = {
        **os.environ,
        **cluster_env,
        "TIDEGATE_REQUIRE_SCALER": "false",  # no scaler here: create ScaledObjects regardless
        "TIDEGATE_RESYNC_SECONDS": "5",
        "TIDEGATE_SIDECAR_IMAGE": "tidegate:test",
    }
    kubectl("create", "quota", "no-gpus", "-n", namespace, "--hard=requests.nvidia.com/gpu=0,limits.nvidia.com/gpu=0")
    log = tmp_path / "operator.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidegate.cli.main", "operator", "-n", namespace],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        kubectl("delete", "inferencepools", "--all", "-n", namespace, "--timeout=60s", check=False)
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # Never leave a namespace stuck Terminating on a finalizer nobody will remove.
        for name in json.loads(kubectl("get", "inferencepools", "-n", namespace, "-o", "json").stdout)["items"]:
            kubectl(
                "patch",
                "inferencepool",
                name["metadata"]["name"],
                "-n",
                namespace,
                "--type=merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
                check=False,
            )
        text = log.read_text()
        if "Traceback" in text:
            print(f"--- operator log ---\n{text[-6000:]}")


def _assert_reconciled(kubectl, namespace: str, pool: dict) -> None:
    name = pool["metadata"]["name"]
    reconciled = wait_for(
        lambda: (
            (p := _get(kubectl, namespace, "inferencepool", name))
            and p.get("status", {}).get("observedGeneration") == p["metadata"]["generation"]
            # KEDA took the ScaledObject (Applied; NotReady once KEDA finds no scaler to ask, as here)
            and _reason(p, "KedaReady") in ("Applied", "NotReady")
            and _condition(p, "Degraded") == "True"
            and "exceeded quota: no-gpus" in _message(p, "Degraded")
            and p
        ),
        timeout_s=90,
        what=f"InferencePool {name} reconciled (observedGeneration, KedaReady, Degraded by the GPU quota)",
    )
    # The quota is the only problem the pool reports.
    assert all("exceeded quota: no-gpus" in part for part in _message(reconciled, "Degraded").split("; ")), _message(
        reconciled, "Degraded"
    )
    assert reconciled["status"]["selector"] == f"tidegate.dev/pool={name}"
    spec = pool["spec"]
    # Applied without replicas (the CRD default 1): the operator serves at least minReplicas.
    active = max(spec.get("replicas", 1), spec.get("scaling", {}).get("minReplicas", 1))
    warm = spec.get("warmPool", {}).get("size", 1)
    deployment = _get(kubectl, namespace, "deployment", name)
    assert deployment["spec"]["replicas"] == active + warm
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == spec["server"]["image"]
    assert pod["initContainers"][-1]["name"] == "tidegate-admission"
    assert _get(kubectl, namespace, "service", name)["spec"]["selector"]["tidegate.dev/serving"] == "true"
    assert _get(kubectl, namespace, "poddisruptionbudget", name) is not None
    config = yaml.safe_load(_get(kubectl, namespace, "configmap", f"{name}-admission")["data"]["config.yaml"])
    # Unset in the pool: unset in the sidecar's config too (each sidecar reads it from its model server).
    assert config["admission"].get("tokenBudget") == spec.get("admission", {}).get("tokenBudget")
    scaled = _get(kubectl, namespace, "scaledobject.keda.sh", name)
    assert scaled["spec"]["maxReplicaCount"] == spec.get("scaling", {}).get("maxReplicas", 8)


@pytest.mark.parametrize("file", FILES)
def test_example_is_accepted_and_reconciled(kubectl, namespace, operator, file) -> None:
    applied = kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / file))
    pools = _pools_in(EXAMPLES / file)
    assert pools and applied.stdout.count("created") >= len(pools)
    for pool in pools:
        _assert_reconciled(kubectl, namespace, pool)


def test_gitops_pools_folder_applies_with_kustomize_and_replicas_come_from_the_api_server(
    kubectl, namespace, operator
) -> None:
    kubectl("apply", "-n", namespace, "-k", str(EXAMPLES / "gitops" / "pools"))
    [pool] = _pools_in(EXAMPLES / "gitops" / "pools" / "chat.yaml")
    stored = _get(kubectl, namespace, "inferencepool", pool["metadata"]["name"])
    assert stored["spec"]["replicas"] == 1  # the CRD default: Git never set it
    _assert_reconciled(kubectl, namespace, pool)
    # The autoscaler's write survives a re-sync of the same Git content.
    kubectl("scale", "inferencepool", pool["metadata"]["name"], "-n", namespace, "--replicas=2")
    kubectl(
        "apply", "--server-side", "--field-manager=gitops", "-n", namespace, "-k", str(EXAMPLES / "gitops" / "pools")
    )
    assert _get(kubectl, namespace, "inferencepool", pool["metadata"]["name"])["spec"]["replicas"] == 2


def test_scaler_tls_trigger_authentication_is_accepted_by_keda_crd(kubectl, namespace) -> None:
    result = kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "scaler-tls.yaml"))
    assert "triggerauthentication.keda.sh/tidegate-scaler-tls created" in result.stdout
    auth = _get(kubectl, namespace, "triggerauthentication.keda.sh", "tidegate-scaler-tls")
    assert auth["spec"]["secretTargetRef"][0]["parameter"] == "caCert"
