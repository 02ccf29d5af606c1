"""ScaledObject before the scaler answers: KEDA meets the pool's ScaledObject while the tidegate
scaler is still starting (its port not listening yet), as after an install that applies both at
once or a scaler pod that restarts just after the operator's health probe passed.

Input: the operator (``TIDEGATE_REQUIRE_SCALER=false``, so it writes the ScaledObject without
waiting for the scaler's health check) makes pool ``late``'s ScaledObject pointing at a scaler
address where nothing listens; STARTING_S later the scaler (a stub answering DESIRED the way
``tidegate scaler`` does) starts on that address. Nothing else is touched.

Expected, from the real KEDA v2.21.0 and the real HPA controller (e2e/cluster/cluster.sh):
- while the scaler is starting, KEDA reports the ScaledObject not Ready and builds no HPA; no
  HPA ever exists for the pool without the external metric (an HPA with no metrics is a CPU
  autoscaler at 80%: Kubernetes' default, ``autoscaling/v2`` HorizontalPodAutoscalerSpec.metrics).
  KEDA v2.21.0 refuses to build one from no metric specs (``controllers/keda/hpa.go``,
  ``getScaledObjectMetricSpecs``: "no metric specs returned from scalers");
- once the scaler answers, KEDA retries on its own (controller-runtime's per-object exponential
  back-off: the longer the scaler took, the longer KEDA may wait, up to about twice), builds the
  HPA with the one External metric, and the HPA writes the pool's ``/scale`` to DESIRED from the
  scaler's answer: ScalingActive=True (ValidMetricFound), the ScaledObject and HPA never edited
  by hand or recreated.

With the operator's default (``TIDEGATE_REQUIRE_SCALER=true``) the ScaledObject is not written
until the scaler answers its health check, so KEDA meets it with the scaler up and builds the HPA
at once: the second test.
"""

import socket
import time
import types
from collections.abc import Iterator

import kubernetes
import pytest

from tests.cluster.conftest import wait_for
from tests.cluster.operator.conftest import StubScaler, operator_env, start_operator, stop_operator
from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION

DESIRED = 3
STARTING_S = 40  # how long the scaler takes to listen (a model-less process: image pull, start)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def scaler_port() -> int:
    return _free_port()


@pytest.fixture
def operator_writing_before_the_scaler(
    cluster_env, api_client, scaler_decisions, scaler_port, tmp_path
) -> Iterator[None]:
    address = types.SimpleNamespace(address=f"127.0.0.1:{scaler_port}")
    env = operator_env(cluster_env, api_client, address, tmp_path, scaler_decisions.url)
    env["TIDEGATE_REQUIRE_SCALER"] = "false"
    proc = start_operator(env, tmp_path / "operator.log")
    try:
        yield
    finally:
        stop_operator(proc)


def _hpa_metrics(api_client, namespace: str) -> dict[str, list[dict]]:
    """Every HPA in ``namespace``: name -> spec.metrics ([] when it has none)."""
    hpas = kubernetes.client.AutoscalingV2Api(api_client).list_namespaced_horizontal_pod_autoscaler(namespace).items
    return {h.metadata.name: api_client.sanitize_for_serialization(h.spec).get("metrics") or [] for h in hpas}


@pytest.mark.timeout(600)
def test_scaled_object_written_before_the_scaler_listens_gets_the_external_metric_once_it_answers(
    api_client, namespace: str, operator_writing_before_the_scaler, scaler_port: int
) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    autoscaling = kubernetes.client.AutoscalingV2Api(api_client)
    body = valid_pool("late")
    body["spec"].update(replicas=1, warmPool={"size": 0}, scaling={"minReplicas": 1, "maxReplicas": 6})
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    seen_hpas: dict[str, list[dict]] = {}

    def watch_hpas() -> None:
        for name, metrics in _hpa_metrics(api_client, namespace).items():
            seen_hpas.setdefault(name, metrics)
            assert metrics and all(m["type"] == "External" for m in metrics), f"HPA {name} without it: {metrics}"

    def scaled_object() -> dict:
        return custom.get_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects", "late")

    def keda_ready(so: dict) -> dict:
        return next((c for c in so.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {})

    def pool_replicas() -> int:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "late")["spec"]["replicas"]

    scaler = None
    try:
        # KEDA meets the ScaledObject with nothing listening at the scaler's address.
        def keda_says_not_ready() -> dict | None:
            watch_hpas()
            try:
                cond = keda_ready(scaled_object())
            except kubernetes.client.ApiException:
                return None
            return cond if cond.get("status") == "False" else None

        not_ready = wait_for(keda_says_not_ready, timeout_s=90, interval_s=1, what="KEDA: ScaledObject late not Ready")
        print(f"\nKEDA while the scaler starts: {not_ready['reason']}: {not_ready['message']}")
        assert not_ready["reason"] == "ScaledObjectCheckFailed", not_ready
        so_generation = scaled_object()["metadata"]["generation"]

        # The scaler is still starting: no HPA, so no CPU default either, and the pool keeps its count.
        written = time.monotonic()
        while time.monotonic() - written < STARTING_S:
            watch_hpas()
            assert pool_replicas() == 1
            time.sleep(1)
        assert not seen_hpas, f"KEDA built an HPA from no metric specs: {seen_hpas}"

        scaler = StubScaler(desired=DESIRED, port=scaler_port).start()
        up = time.monotonic()

        def external_hpa() -> bool:
            watch_hpas()
            return "keda-hpa-late" in seen_hpas

        wait_for(external_hpa, timeout_s=4 * STARTING_S + 120, interval_s=1, what="KEDA builds the HPA on its own")
        hpa_after_s = time.monotonic() - up
        (metric,) = seen_hpas["keda-hpa-late"]
        assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}, metric
        hpa_uid = autoscaling.read_namespaced_horizontal_pod_autoscaler("keda-hpa-late", namespace).metadata.uid

        def scaled_to_desired() -> bool:
            watch_hpas()
            return pool_replicas() == DESIRED

        wait_for(scaled_to_desired, timeout_s=120, interval_s=1, what=f"the HPA writes /scale {DESIRED}")
        scale_after_s = time.monotonic() - up
        # The HPA controller writes /scale, then its own status (a separate update, retried on the
        # next sync when it conflicts): a CI run read the status still empty right after the write.
        hpa = wait_for(
            lambda: (h := autoscaling.read_namespaced_horizontal_pod_autoscaler("keda-hpa-late", namespace))
            and h.status.desired_replicas == DESIRED
            and h,
            timeout_s=30, interval_s=0.5, what=f"the HPA's status saying {DESIRED}",
        )  # fmt: skip
        assert hpa.metadata.uid == hpa_uid, "the HPA was recreated"
        active = {c.type: (c.status, c.reason) for c in hpa.status.conditions or []}
        assert active["ScalingActive"] == ("True", "ValidMetricFound"), active
        assert active["AbleToScale"][0] == "True", active
        assert any(name == "GetMetrics" and meta.get("pool") == "late" for name, meta in scaler.calls)
        so = scaled_object()
        assert keda_ready(so).get("status") == "True", so["status"]
        assert so["metadata"]["generation"] == so_generation, "the ScaledObject's spec was edited"
        print(
            f"scaler listening after {STARTING_S} s; KEDA built the HPA {hpa_after_s:.0f} s later, "
            f"/scale {DESIRED} written {scale_after_s:.0f} s after the scaler answered"
        )
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "late")
        wait_for(
            lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
            timeout_s=90,
            what="pool late deleted",
        )
        if scaler:
            scaler.stop()


@pytest.fixture
def operator_waiting_for_the_scaler(cluster_env, api_client, scaler_decisions, scaler_port, tmp_path) -> Iterator[None]:
    address = types.SimpleNamespace(address=f"127.0.0.1:{scaler_port}")
    env = operator_env(cluster_env, api_client, address, tmp_path, scaler_decisions.url)  # requireScaler: default
    proc = start_operator(env, tmp_path / "operator.log")
    try:
        yield
    finally:
        stop_operator(proc)


@pytest.mark.timeout(420)
def test_by_default_the_scaled_object_waits_for_the_scaler_and_the_hpa_follows_at_once(
    api_client, namespace: str, operator_waiting_for_the_scaler, scaler_port: int
) -> None:
    # Input: the same start, with the operator's default (TIDEGATE_REQUIRE_SCALER=true, chart
    # operator.requireScaler). Expected: no ScaledObject while the scaler does not answer its
    # health check, and the pool says why (ScalerReachable=False, HealthCheckFailed); once it
    # answers, the ScaledObject is written, and the real KEDA builds the External-metric HPA
    # straight away (none of KEDA's retry back-off), which writes /scale DESIRED.
    custom = kubernetes.client.CustomObjectsApi(api_client)
    body = valid_pool("guarded")
    body["spec"].update(replicas=1, warmPool={"size": 0}, scaling={"minReplicas": 1, "maxReplicas": 6})
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def pool() -> dict:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "guarded")

    def scaled_objects() -> list[dict]:
        return custom.list_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects")["items"]

    scaler = None
    try:
        cond = wait_for(
            lambda: next(
                (c for c in pool().get("status", {}).get("conditions", []) if c["type"] == "ScalerReachable"), None
            ),
            timeout_s=60,
            interval_s=1,
            what="ScalerReachable on the pool",
        )
        assert (cond["status"], cond["reason"]) == ("False", "HealthCheckFailed"), cond
        since = time.monotonic()
        while time.monotonic() - since < 15:
            assert not scaled_objects(), "a ScaledObject before the scaler answers"
            time.sleep(1)

        scaler = StubScaler(desired=DESIRED, port=scaler_port).start()
        up = time.monotonic()
        wait_for(lambda: pool()["spec"]["replicas"] == DESIRED, timeout_s=90, interval_s=1, what=f"/scale {DESIRED}")
        (metric,) = _hpa_metrics(api_client, namespace)["keda-hpa-guarded"]
        assert metric["type"] == "External", metric
        print(f"\n/scale {DESIRED} written {time.monotonic() - up:.0f} s after the scaler answered")
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "guarded")
        wait_for(
            lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
            timeout_s=90,
            what="pool guarded deleted",
        )
        if scaler:
            scaler.stop()
