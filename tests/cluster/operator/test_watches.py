"""What KEDA and Karpenter write reaches the pool's conditions at once, not at the next resync (issue 12).

The operator here resyncs every 600 s, and the pools have no pods (replicas 0), so past kopf's
first resync (5 s after a pool appears) no pod or Deployment event reconciles them: only a watch on
the NodePool (Karpenter's status) and on the ScaledObject (KEDA's status) can bring NodePoolReady
and KedaReady up to date within seconds.
"""

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import kubernetes
import pytest

from tests.cluster.conftest import new_namespace_name, wait_for
from tests.cluster.operator.conftest import StubScaler, operator_env, start_operator, stop_operator
from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION

# Far longer than any wait below: a condition that changes within them was brought by a watch.
RESYNC_S = "600"
WATCH_DEADLINE_S = 45
INITIAL_RESYNC_S = 5  # handlers.resync: initial_delay=min(5, resync)


@pytest.fixture
def slow_resync_operator(cluster_env, api_client, scaler_health, tmp_path) -> Iterator[None]:
    env = {**operator_env(cluster_env, api_client, scaler_health, tmp_path), "TIDEGATE_RESYNC_SECONDS": RESYNC_S}
    proc = start_operator(env, tmp_path / "operator.log")
    try:
        yield
    finally:
        stop_operator(proc)


def _condition(custom, namespace: str, pool: str, ctype: str) -> dict:
    body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, pool)
    return next((c for c in body.get("status", {}).get("conditions", []) if c["type"] == ctype), {})


def _idle_pool(name: str, **spec) -> dict:
    body = valid_pool(name)
    body["spec"].update(replicas=0, warmPool={"size": 0}, **spec)
    body["spec"]["scaling"] = {"minReplicas": 0, "maxReplicas": 2, **spec.get("scaling", {})}
    return body


@pytest.mark.usefixtures("slow_resync_operator")
def test_node_pool_ready_follows_karpenter_without_waiting_for_a_resync(api_client, namespace: str) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    node_class = f"late-{uuid.uuid4().hex[:8]}"
    body = _idle_pool(
        "np",
        server={"image": "x", "gpus": 1},
        scaling={"keda": False},
        nodePool={
            "enabled": True,
            "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": node_class},
        },
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    try:
        # Karpenter marks the NodePool after the operator's first reconcile has written the pool's status.
        missing = wait_for(
            lambda: (c := _condition(custom, namespace, "np", "NodePoolReady")).get("reason") == "NotReady" and c,
            timeout_s=WATCH_DEADLINE_S,
            interval_s=1,
            what="NodePoolReady=False NotReady (NodeClassNotFound) without a resync",
        )
        assert "NodeClassReady=False (NodeClassNotFound" in missing["message"]
        # kopf's resync timer also fires once INITIAL_RESYNC_S after a pool appears; past it, only a
        # watch reconciles this pool for the next 600 s.
        time.sleep(INITIAL_RESYNC_S + 3)
        # The node class appears: Karpenter marks the NodePool Ready, and the pool follows.
        custom.create_cluster_custom_object(
            "karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses",
            {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": node_class}},
        )  # fmt: skip
        ready = wait_for(
            lambda: (c := _condition(custom, namespace, "np", "NodePoolReady")).get("status") == "True" and c,
            timeout_s=WATCH_DEADLINE_S,
            interval_s=1,
            what="NodePoolReady=True once the node class exists, without a resync",
        )
        assert "is Ready in Karpenter" in ready["message"]
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "np")
        wait_for(
            lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
            timeout_s=60,
            what="the pool deleted (its NodePool with it)",
        )
        custom.delete_cluster_custom_object("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses", node_class)


@pytest.fixture
def stub_scaler_operator(cluster_env, api_client, tmp_path) -> Iterator[StubScaler]:
    scaler = StubScaler(desired=0).start()
    env = {**operator_env(cluster_env, api_client, scaler, tmp_path), "TIDEGATE_RESYNC_SECONDS": RESYNC_S}
    proc = start_operator(env, tmp_path / "operator.log")
    try:
        yield scaler
    finally:
        stop_operator(proc)
        scaler.stop()


def test_keda_ready_says_what_keda_says_of_the_scaled_object(api_client, namespace: str, stub_scaler_operator) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, _idle_pool("k", scaling={"pollingIntervalSeconds": 2})
    )

    def scaled_object_ready() -> dict:
        so = custom.get_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects", "k")
        return next((c for c in so.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {})

    wait_for(
        lambda: (
            _condition(custom, namespace, "k", "KedaReady").get("status") == "True"
            and scaled_object_ready().get("status") == "True"
        ),
        timeout_s=WATCH_DEADLINE_S,
        interval_s=1,
        what="KEDA Ready with the stub scaler answering",
    )
    time.sleep(INITIAL_RESYNC_S + 3)  # past kopf's first resync: only a watch reconciles now
    stub_scaler_operator.stop()  # the scaler goes away: KEDA's next poll fails
    keda_ready = wait_for(
        lambda: (c := _condition(custom, namespace, "k", "KedaReady")).get("status") == "False" and c,
        timeout_s=WATCH_DEADLINE_S,
        interval_s=1,
        what="KedaReady=False once KEDA reports the ScaledObject not Ready, without a resync",
    )
    keda = scaled_object_ready()
    assert keda["status"] == "False"
    assert keda_ready["reason"] == "NotReady"
    assert f"KEDA reports ScaledObject k not Ready: {keda['reason']}: " in keda_ready["message"], keda_ready


def test_a_namespaced_operator_does_not_reconcile_a_pool_of_another_namespace_when_its_node_pool_changes(
    cluster_env, api_client, scaler_health, namespace: str, tmp_path
) -> None:
    # `tidegate operator -n <namespace>`; a pool elsewhere, with a NodePool labelled as the operator
    # labels its own. kopf watches cluster-scoped NodePools in every namespace whatever -n says.
    custom = kubernetes.client.CustomObjectsApi(api_client)
    core = kubernetes.client.CoreV1Api(api_client)
    other = new_namespace_name()
    core.create_namespace({"metadata": {"name": other, "labels": {"tidegate.dev/test": "true"}}})
    env = {**operator_env(cluster_env, api_client, scaler_health, tmp_path), "TIDEGATE_RESYNC_SECONDS": RESYNC_S}
    with (tmp_path / "operator.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidegate.cli.main", "operator", "-n", namespace],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    np_name = f"tidegate-{other}-elsewhere"
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, other, PLURAL, _idle_pool("elsewhere"))
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _idle_pool("here"))
        wait_for(
            lambda: _condition(custom, namespace, "here", "Ready"),
            timeout_s=WATCH_DEADLINE_S,
            what="the operator serving its own namespace",
        )
        labels = {
            "app.kubernetes.io/managed-by": "tidegate",
            "tidegate.dev/pool": "elsewhere",
            "tidegate.dev/namespace": other,
        }
        node_pool = {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodePool",
            "metadata": {"name": np_name, "labels": labels},
            "spec": {
                "template": {
                    "spec": {
                        "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
                        "requirements": [],
                    }
                }
            },
        }
        custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", node_pool)
        time.sleep(10)  # Karpenter marks the NodePool within seconds: a NodePool event the operator sees
        assert not custom.get_namespaced_custom_object(GROUP, VERSION, other, PLURAL, "elsewhere").get("status")
        assert not kubernetes.client.AppsV1Api(api_client).list_namespaced_deployment(other).items
    finally:
        stop_operator(proc)
        custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", np_name)
        core.delete_namespace(other, propagation_policy="Background")
