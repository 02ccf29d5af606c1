"""Scale to zero (``scaling.minReplicas: 0``) with the real KEDA v2.21.0 and HPA controller.

At ``minReplicas: 0`` KEDA's own loop polls the scaler's IsActive every ``pollingInterval`` and,
once it has been False for ``cooldownPeriod``, writes ``/scale`` 0 itself, from whatever count
the pool has (KEDA ``pkg/scaling/executor/scale_scaledobjects.go``; the HPA and its ``behavior``
are bypassed). So IsActive must stay True while a replica is on its way to serving, and while
more than one replica is active (the HPA takes an idle pool down to one, in its steps). A
ScaledObject never yet active is scaled to 0 once ``initialCooldownPeriod`` has passed since its
creation (its ``cooldownPeriod`` counts from the last active answer: same file,
``scaleToZeroOrIdle``).

Time is shortened through the pool spec, as the API allows: ``scaleDownCooldownSeconds: 0``
(KEDA's ``cooldownPeriod`` is then 30 s, the operator's floor), ``pollingIntervalSeconds: 2``,
``server.startupTimeoutSeconds`` 10 to 40 s (KEDA's ``initialCooldownPeriod``; 600 s by default).
"""

import itertools
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator

import grpc
import kubernetes
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.cluster.conftest import wait_for
from tests.cluster.operator.conftest import StubScaler, operator_env, start_operator, stop_operator
from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION, constants
from tidegate.api.pool import InferencePool
from tidegate.scaler import law

KEDA_COOLDOWN_S = 30  # max(scaleDownCooldownSeconds, 30): operator/builders/scaled_object.py
INITIAL_COOLDOWN_S = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scaling(**extra) -> dict:
    return {"minReplicas": 0, "scaleDownCooldownSeconds": 0, "pollingIntervalSeconds": 2, **extra}


@pytest.fixture
def real_scaler(cluster_env, tmp_path) -> Iterator[types.SimpleNamespace]:
    """``tidegate scaler`` watching the cluster's pods (the admin kubeconfig), its side port for /decisions."""
    port, side = _free_port(), _free_port()
    address = f"127.0.0.1:{port}"
    with (tmp_path / "scaler.log").open("a") as log:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "tidegate.cli.main", "scaler", "--listen", address, "--pods", "kubernetes",
                "--kubeconfig", cluster_env["KUBECONFIG"], "--min-refresh-s", "0.5", "--sidecar-timeout-s", "0.3",
                "--metrics-port", str(side),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def serving() -> bool:
        with grpc.insecure_channel(address) as channel:
            try:
                answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.RpcError:
                return False
            return answer.status == health_pb2.HealthCheckResponse.SERVING

    try:
        wait_for(serving, timeout_s=60, interval_s=0.5, what="tidegate scaler serving")
        yield types.SimpleNamespace(address=address, decisions_url=f"http://127.0.0.1:{side}")
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        print(f"--- scaler log ---\n{(tmp_path / 'scaler.log').read_text()[-3000:]}")


def _delete_pool(custom, namespace: str, name: str) -> None:
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    wait_for(
        lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
        timeout_s=90,
        what=f"pool {name} deleted",
    )


@pytest.mark.timeout(420)
def test_a_replica_loading_longer_than_the_cooldown_is_not_scaled_to_zero(
    cluster_env, api_client, namespace: str, real_scaler, tmp_path
) -> None:
    # Input: pool "load" at 1 replica, minReplicas 0, no warm pool; its one pod never becomes Ready
    # (it waits for a node: from the scaler's side the same as a model still loading). The real
    # tidegate scaler answers KEDA. Expected: for well over KEDA's initialCooldownPeriod +
    # cooldownPeriod, /scale stays 1 and the pod is never deleted; the scaler says it is holding
    # for a replica on its way.
    env = operator_env(cluster_env, api_client, real_scaler, tmp_path, real_scaler.decisions_url)
    operator = start_operator(env, tmp_path / "operator.log")
    custom = kubernetes.client.CustomObjectsApi(api_client)
    core = kubernetes.client.CoreV1Api(api_client)
    body = valid_pool("load")
    body["spec"].update(
        replicas=1,
        warmPool={"size": 0},
        server={
            "image": "vllm/vllm-openai:v0.11.0",
            "startupTimeoutSeconds": INITIAL_COOLDOWN_S,
            "nodeSelector": {"test.tidegate.dev/model-loading": "forever"},
        },
        scaling=_scaling(maxReplicas=2),
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def pool() -> dict:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "load")

    try:
        so = wait_for(
            lambda: next(
                iter(custom.list_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects")["items"]),
                None,
            ),
            timeout_s=60,
            interval_s=1,
            what="the ScaledObject",
        )
        assert (so["spec"]["minReplicaCount"], so["spec"]["cooldownPeriod"]) == (0, KEDA_COOLDOWN_S)
        loading = wait_for(
            lambda: next(
                (p for p in core.list_namespaced_pod(namespace, label_selector=f"{constants.LABEL_POOL}=load").items),
                None,
            ),
            timeout_s=60,
            interval_s=1,
            what="the pool's pod",
        )
        since = time.monotonic()
        while time.monotonic() - since < INITIAL_COOLDOWN_S + KEDA_COOLDOWN_S + 45:
            assert pool()["spec"]["replicas"] == 1, "KEDA scaled the pool to 0 while its replica was loading"
            pods = core.list_namespaced_pod(namespace, label_selector=f"{constants.LABEL_POOL}=load").items
            assert [p.metadata.uid for p in pods] == [loading.metadata.uid], "the loading replica was deleted"
            time.sleep(1)
        signal = pool().get("status", {}).get("signal", {})
        print(f"\nafter {time.monotonic() - since:.0f} s: replicas 1, scaler: {signal.get('reason')}")
        assert "loading" in signal.get("reason", ""), signal
        so = custom.get_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects", "load")
        active = next(c for c in so["status"]["conditions"] if c["type"] == "Active")
        assert active["status"] == "True", active
    finally:
        _delete_pool(custom, namespace, "load")
        stop_operator(operator)


class LawScaler(StubScaler):
    """A stub scaler answering what the real law (``tidegate.scaler.law.decide``) answers for an
    idle pool (no demand, nothing in flight, fresh stats from every active replica) whose active
    count ``active()`` reads from the cluster on each call; the law's state is kept between calls."""

    def __init__(self, policy: law.Policy, active: Callable[[], int]) -> None:
        super().__init__(desired=0.0)
        self.policy, self.active, self.state = policy, active, law.LawState()
        self.lock = threading.Lock()

    def decide(self) -> law.Decision:
        n = self.active()
        idle = law.Observation(active=n, reporting=n, fresh=n, window_s=60.0, token_budget=1000 * n)
        with self.lock:
            decision, self.state = law.decide(self.policy, idle, self.state, time.monotonic())
        return decision

    def is_active(self) -> bool:
        return self.decide().active

    def metric(self) -> float:
        return self.decide().metric_value


@pytest.mark.timeout(420)
def test_an_idle_pool_of_three_steps_down_and_only_its_last_replica_goes_to_zero(
    cluster_env, api_client, scaler_decisions, namespace: str, tmp_path
) -> None:
    # Input: pool "idle" at 3 active replicas, minReplicas 0, no demand at all; a stub scaler
    # answers KEDA what the real law answers for that (desired 0 once the law's 0 s cooldown has
    # passed; IsActive per the law). Expected: /scale never leaves 3 or 2 for 0: KEDA's loop does
    # not take the pool to 0 after its 30 s cooldownPeriod; the HPA brings it down in its own steps
    # (the operator's 60 s scale-down window first, then 1 pod per 60 s: /scale may step 3 -> 2
    # while this test watches), and only the last replica is KEDA's to take.
    custom = kubernetes.client.CustomObjectsApi(api_client)
    body = valid_pool("idle")
    body["spec"].update(
        replicas=3,
        warmPool={"size": 0},
        # long enough for kwok to make the 3 pods Ready and the operator to promote them
        server={"image": "vllm/vllm-openai:v0.11.0", "startupTimeoutSeconds": 3 * INITIAL_COOLDOWN_S},
        scaling=_scaling(maxReplicas=4),
    )

    def pool() -> dict:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "idle")

    spec = InferencePool.model_validate({**body, "metadata": {"name": "idle", "namespace": namespace}}).spec
    scaler = LawScaler(law.Policy.from_spec(spec.scaling), lambda: pool().get("status", {}).get("replicas", 0))
    scaler.start()
    env = operator_env(cluster_env, api_client, scaler, tmp_path, scaler_decisions.url)
    operator = start_operator(env, tmp_path / "operator.log")
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    started = time.monotonic()
    try:
        wait_for(lambda: pool().get("status", {}).get("readyReplicas") == 3, timeout_s=90, interval_s=1, what="3 ready")
        seen = [3]
        while time.monotonic() - started < 3 * INITIAL_COOLDOWN_S + KEDA_COOLDOWN_S + 60:
            n = pool()["spec"]["replicas"]
            if n != seen[-1]:
                seen.append(n)
            time.sleep(0.5)
        so = custom.get_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects", "idle")
        keda = {c["type"]: c["status"] for c in so["status"]["conditions"]}
        print(f"\n/scale over {time.monotonic() - started:.0f} s idle: {seen}; KEDA: {keda}")
        assert all(b == a - 1 for a, b in itertools.pairwise(seen)), f"/scale went {seen}: more than one at once"
        assert seen[-1] >= 1, f"/scale went {seen}"
    finally:
        _delete_pool(custom, namespace, "idle")
        stop_operator(operator)
        scaler.stop()


@pytest.mark.timeout(420)
def test_a_warm_pool_is_not_scaled_to_zero_the_moment_its_scaled_object_appears(
    cluster_env, api_client, scaler_decisions, namespace: str, tmp_path
) -> None:
    # Input: pool "warm" serving 1 ready replica with scaling.keda false, minReplicas 0, idle; then
    # scaling.keda turns true and the operator writes its ScaledObject. A stub scaler answers
    # what the real law answers for an idle pool of one (IsActive False). Expected: KEDA leaves
    # /scale at 1 for its initialCooldownPeriod (the operator writes server.startupTimeoutSeconds,
    # here 40 s; KEDA's default is 0: at once), then, the pool still idle, takes it to 0.
    initial_s = 4 * INITIAL_COOLDOWN_S
    custom = kubernetes.client.CustomObjectsApi(api_client)
    body = valid_pool("warm")
    body["spec"].update(
        replicas=1,
        warmPool={"size": 0},
        server={"image": "vllm/vllm-openai:v0.11.0", "startupTimeoutSeconds": initial_s},
        scaling=_scaling(maxReplicas=2, keda=False),
    )

    def pool() -> dict:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "warm")

    spec = InferencePool.model_validate({**body, "metadata": {"name": "warm", "namespace": namespace}}).spec
    scaler = LawScaler(law.Policy.from_spec(spec.scaling), lambda: pool().get("status", {}).get("replicas", 0))
    scaler.start()
    env = operator_env(cluster_env, api_client, scaler, tmp_path, scaler_decisions.url)
    operator = start_operator(env, tmp_path / "operator.log")
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def scaled_object() -> dict | None:
        items = custom.list_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects")["items"]
        return items[0] if items else None

    try:
        wait_for(lambda: pool().get("status", {}).get("readyReplicas") == 1, timeout_s=90, interval_s=1, what="1 ready")
        assert scaled_object() is None
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "warm", {"spec": {"scaling": {"keda": True}}}
        )
        so = wait_for(scaled_object, timeout_s=60, interval_s=0.5, what="the ScaledObject")
        appeared = time.monotonic()
        assert so["spec"]["initialCooldownPeriod"] == initial_s
        while time.monotonic() - appeared < initial_s - 5:
            assert pool()["spec"]["replicas"] == 1, (
                f"KEDA scaled the warm pool to 0 {time.monotonic() - appeared:.0f} s after its ScaledObject appeared"
            )
            time.sleep(0.5)
        wait_for(
            lambda: pool()["spec"]["replicas"] == 0,
            timeout_s=KEDA_COOLDOWN_S + 60,
            interval_s=0.5,
            what="the idle pool at 0 once initialCooldownPeriod has passed",
        )
        print(f"\n/scale 1 -> 0 {time.monotonic() - appeared:.0f} s after the ScaledObject appeared")
    finally:
        _delete_pool(custom, namespace, "warm")
        stop_operator(operator)
        scaler.stop()
