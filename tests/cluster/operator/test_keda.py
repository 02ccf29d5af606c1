"""The real KEDA and the real HPA controller drive an InferencePool.

KEDA v2.21.0 (operator, metrics API server, admission webhooks) runs beside the local control
plane (e2e/cluster/cluster.sh); kube-controller-manager's HPA controller is the real one. The
operator writes the ScaledObject; the external scaler is a stub that answers a known replica
count the way ``tidegate scaler`` does (the count as the metric, ``AverageValue`` target 1), so
what is tested is the seam: KEDA accepts tidegate's ScaledObject, builds the HPA with tidegate's
``behavior``, and the HPA writes the pool's ``/scale`` from the scaler's answer.
"""

import json
from collections.abc import Iterator

import kubernetes
import pytest
import yaml

from tests.cluster.conftest import wait_for
from tests.cluster.operator.conftest import StubScaler, operator_env, start_operator, stop_operator
from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION
from tidegate.api.pool import InferencePool
from tidegate.operator import builders
from tidegate.operator.settings import OperatorSettings

DESIRED = 3


@pytest.fixture(scope="module")
def stub_scaler() -> Iterator[StubScaler]:
    scaler = StubScaler(desired=DESIRED).start()
    yield scaler
    scaler.stop()


@pytest.fixture(scope="module")
def keda_operator(cluster_env, api_client, stub_scaler, scaler_decisions, tmp_path_factory) -> Iterator[None]:
    """The operator, with ScaledObjects pointing at the stub scaler."""
    workdir = tmp_path_factory.mktemp("operator-keda")
    env = operator_env(cluster_env, api_client, stub_scaler, workdir, scaler_decisions.url)
    log_path = workdir / "operator.log"
    proc = start_operator(env, log_path)
    try:
        yield
    finally:
        stop_operator(proc)
        text = log_path.read_text()
        if "Traceback" in text:
            print(f"--- operator log ({log_path}) ---\n{text[-8000:]}")


def _scaled_object(namespace: str, **scaling) -> dict:
    body = valid_pool("dry")
    body["metadata"]["namespace"] = namespace
    body["spec"]["scaling"] = scaling
    return builders.scaled_object(InferencePool.model_validate(body), OperatorSettings(scaler_address="127.0.0.1:1"))


def test_keda_webhook_accepts_the_operators_scaled_object_without_warnings(kubectl, namespace: str) -> None:
    def warnings(so: dict) -> str:
        result = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(so))
        return result.stderr

    built = _scaled_object(namespace, minReplicas=1, maxReplicas=4)
    assert "not relevant" not in warnings(built)
    # The webhook answered (its failurePolicy is Ignore: a dead webhook would pass silently too):
    # the same object with the fields tidegate now leaves out draws KEDA's warning.
    assert "PollingInterval is configured but is not relevant" in warnings(
        {**built, "spec": {**built["spec"], "pollingInterval": 15, "cooldownPeriod": 300}}
    )
    # At minReplicas 0 KEDA's own loop scales 0 <-> 1, and the fields are written, without warning.
    at_zero = _scaled_object(namespace, minReplicas=0, maxReplicas=4)
    assert "pollingInterval" in at_zero["spec"]
    assert "not relevant" not in warnings(at_zero)


def test_real_hpa_writes_the_pools_scale_from_the_external_scaler(
    api_client, namespace: str, keda_operator, stub_scaler: StubScaler
) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    body = valid_pool("k")
    body["spec"].update(replicas=1, scaling={"minReplicas": 1, "maxReplicas": 6, "maxScaleUpStep": 4})
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def ready_scaled_object() -> dict | None:
        try:
            so = custom.get_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects", "k")
        except kubernetes.client.ApiException:
            return None
        conditions = {c["type"]: c["status"] for c in so.get("status", {}).get("conditions", [])}
        return so if conditions.get("Ready") == "True" else None

    so = wait_for(ready_scaled_object, timeout_s=90, interval_s=1, what="ScaledObject k Ready in KEDA")
    assert so["status"]["hpaName"] == "keda-hpa-k"

    autoscaling = kubernetes.client.AutoscalingV2Api(api_client)
    hpa = wait_for(
        lambda: next(iter(autoscaling.list_namespaced_horizontal_pod_autoscaler(namespace).items), None),
        timeout_s=30,
        what="the HPA KEDA builds",
    )
    hpa = api_client.sanitize_for_serialization(hpa)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferencePool", "name": "k"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 6)
    behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    for direction in ("scaleUp", "scaleDown"):
        for key, value in behavior[direction].items():
            assert hpa["spec"]["behavior"][direction][key] == value, (direction, key)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External" and metric["external"]["target"] == {
        "type": "AverageValue",
        "averageValue": "1",
    }

    def pool_replicas() -> int:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "k")["spec"]["replicas"]

    # The HPA controller syncs every 5 s here (cluster.sh; 15 s by default); each sync asks KEDA's
    # metrics API server, which asks the scaler.
    wait_for(lambda: pool_replicas() == DESIRED, timeout_s=120, interval_s=1, what=f"/scale written to {DESIRED}")
    asked = [meta for name, meta in stub_scaler.calls if name == "GetMetrics"]
    assert any(meta.get("pool") == "k" and meta.get("namespace") == namespace for meta in asked), json.dumps(
        stub_scaler.calls[-5:]
    )
    status = autoscaling.read_namespaced_horizontal_pod_autoscaler("keda-hpa-k", namespace).status
    assert status.desired_replicas == DESIRED

    # Deleted while the operator runs (its finalizer), so the pool's GPUs are free for the next tests.
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "k")
    wait_for(
        lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
        timeout_s=60,
        what="pool k deleted",
    )
