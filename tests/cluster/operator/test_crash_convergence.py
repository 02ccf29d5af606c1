"""The operator killed (SIGKILL) at 20+ random moments while pools change: it always converges,
leaves no orphans and never duplicates a child."""

import random
import signal
import time
from typing import Any

import kubernetes

from tests.cluster.conftest import wait_for
from tests.cluster.operator.conftest import operator_env, start_operator, stop_operator
from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION, constants

KILLS = 20
POOLS = {"alpha": (2, 1), "beta": (1, 2), "gamma": (3, 0)}  # name -> (replicas, warm)


def _pool(name: str, replicas: int, warm: int) -> dict[str, Any]:
    body = valid_pool(name)
    # minReplicas 0: the random /scale writes include 0, which the operator serves only when the
    # pool allows it (it holds spec.replicas within scaling.minReplicas..maxReplicas)
    body["spec"].update({"replicas": replicas, "warmPool": {"size": warm}, "scaling": {"minReplicas": 0}})
    return body


def _converged(api_client, ns: str, want: dict[str, tuple[int, int]]) -> bool:
    apps = kubernetes.client.AppsV1Api(api_client)
    core = kubernetes.client.CoreV1Api(api_client)
    custom = kubernetes.client.CustomObjectsApi(api_client)
    deployments = {d.metadata.name: d for d in apps.list_namespaced_deployment(ns).items}
    if set(deployments) != set(want):
        return False
    for name, (replicas, warm) in want.items():
        pool = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        if pool.get("status", {}).get("observedGeneration") != pool["metadata"]["generation"]:
            return False
        if deployments[name].spec.replicas != replicas + warm:
            return False
        pods = [
            p
            for p in core.list_namespaced_pod(ns, label_selector=f"{constants.LABEL_POOL}={name}").items
            if not p.metadata.deletion_timestamp
        ]
        roles = [p.metadata.labels.get(constants.LABEL_ROLE) for p in pods]
        if roles.count("active") != replicas or roles.count("warm") != warm or len(pods) != replicas + warm:
            return False
    return True


def test_killed_operator_converges_without_orphans_or_duplicates(
    cluster_env, api_client, scaler_health, namespace: str, tmp_path
) -> None:
    rng = random.Random(20261130)
    env = operator_env(cluster_env, api_client, scaler_health, tmp_path)
    log_path = tmp_path / "operator.log"
    custom = kubernetes.client.CustomObjectsApi(api_client)
    core = kubernetes.client.CoreV1Api(api_client)
    want = dict(POOLS)
    for name, (replicas, warm) in want.items():
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _pool(name, replicas, warm))

    for _ in range(KILLS):
        proc = start_operator(env, log_path)
        deadline = time.monotonic() + rng.uniform(0.8, 3.0)
        while time.monotonic() < deadline:
            name = rng.choice(sorted(want))
            action = rng.random()
            if action < 0.6:
                replicas = rng.randint(0, 4)
                want[name] = (replicas, want[name][1])
                custom.patch_namespaced_custom_object_scale(
                    GROUP, VERSION, namespace, PLURAL, name, {"spec": {"replicas": replicas}}
                )
            elif action < 0.8:
                try:
                    core.delete_namespaced_service(name, namespace)
                except kubernetes.client.ApiException as exc:
                    if exc.status != 404:
                        raise
            time.sleep(rng.uniform(0.05, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    proc = start_operator(env, log_path)
    try:
        wait_for(lambda: _converged(api_client, namespace, want), timeout_s=90, what=f"convergence to {want}")
        # No orphans: every tidegate-managed namespaced child is owned by a live pool.
        for cm in core.list_namespaced_config_map(
            namespace, label_selector="app.kubernetes.io/managed-by=tidegate"
        ).items:
            assert cm.metadata.owner_references and cm.metadata.owner_references[0].name in want
        services = core.list_namespaced_service(namespace).items
        assert sorted(s.metadata.name for s in services) == sorted(want)
        replica_sets = kubernetes.client.AppsV1Api(api_client).list_namespaced_replica_set(namespace).items
        assert len(replica_sets) == len(want), "one ReplicaSet per pool: the pod template never churned"
    finally:
        stop_operator(proc)
