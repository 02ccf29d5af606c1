"""Serving warm replicas on the real API server (``spec.warmPool.serve``, #13): the warm pod's address
is in the Service's EndpointSlice, the real EndpointSlice controller's, and leaves it when ``serve`` is
turned off, without rolling the Deployment; an operator upgrade never leaves the Service empty.

EndpointSlices refuse loopback addresses, and the cluster's nodes hand out loopback pod IPs
(e2e/cluster/manifests/gpu-nodes.yaml). Each test here makes a kwok node of its own whose podCIDR is
routable-looking (10.77.x.0/24; nothing connects to it), tainted so that only its pool's pods land
on it, and deletes it afterwards.
"""

import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from tests.cluster.conftest import wait_for
from tests.cluster.operator.conftest import operator_env, start_operator, stop_operator
from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION, constants
from tidegate.api.pool import InferencePool
from tidegate.operator import builders
from tidegate.operator.kube import Kube
from tidegate.operator.settings import OperatorSettings

NODE_KEY = "tidegate.dev/test-node"


@pytest.fixture
def node(api_client) -> Iterator[str]:
    """A kwok node of this test's own (8 GPUs, a 10.77.x.0/24 podCIDR); its tag is returned."""
    core = kubernetes.client.CoreV1Api(api_client)
    tag = uuid.uuid4().hex[:8]
    name = f"kwok-routable-{tag}"
    cidr = f"10.77.{random.randrange(256)}.0/24"
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}
    core.create_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok", NODE_KEY: tag},
            },
            "spec": {
                "podCIDR": cidr,
                "podCIDRs": [cidr],
                "taints": [{"key": NODE_KEY, "value": tag, "effect": "NoSchedule"}],
            },
            "status": {"allocatable": resources, "capacity": resources},
        }
    )
    try:
        wait_for(
            lambda: any(c.type == "Ready" and c.status == "True" for c in core.read_node(name).status.conditions or []),
            what=f"node {name} Ready",
        )
        yield tag
    finally:
        core.delete_node(name)


class Operator:
    """A ``tidegate operator`` process this test starts and stops (an upgrade is a restart)."""

    def __init__(self, env: dict[str, str], log_path) -> None:
        self.env, self.log_path, self.proc = env, log_path, None

    def start(self) -> None:
        self.proc = start_operator(self.env, self.log_path)

    def stop(self) -> None:
        if self.proc is not None:
            stop_operator(self.proc)
            self.proc = None


@pytest.fixture
def operator(cluster_env, api_client, scaler_health, scaler_decisions, tmp_path) -> Iterator[Operator]:
    op = Operator(
        operator_env(cluster_env, api_client, scaler_health, tmp_path, scaler_decisions.url), tmp_path / "log"
    )
    op.start()
    try:
        yield op
    finally:
        op.stop()


def _pool(name: str, tag: str, serve: bool) -> dict[str, Any]:
    body = valid_pool(name)
    body["spec"].update(
        replicas=1,
        warmPool={"size": 1, "serve": serve},
        scaling={"keda": False},
        server={
            "image": "vllm/vllm-openai:v0.11.0",
            "gpus": 1,
            "nodeSelector": {NODE_KEY: tag},
            "tolerations": [{"key": NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        },
    )
    return body


class Pool:
    def __init__(self, api_client, namespace: str, name: str) -> None:
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.apps = kubernetes.client.AppsV1Api(api_client)
        self.discovery = kubernetes.client.DiscoveryV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.namespace, self.name = namespace, name

    def create(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def set_serve(self, serve: bool) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name, {"spec": {"warmPool": {"serve": serve}}}
        )

    def ips(self) -> dict[str, tuple[str, str]]:
        """role -> (pod name, IP) of the live, Ready pods that have an IP."""
        items = self.core.list_namespaced_pod(self.namespace, label_selector=f"{constants.LABEL_POOL}={self.name}")
        out = {}
        for p in items.items:
            ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            if not p.metadata.deletion_timestamp and ready and p.status.pod_ip:
                out[p.metadata.labels.get(constants.LABEL_ROLE)] = (p.metadata.name, p.status.pod_ip)
        return out

    def endpoints(self) -> set[str]:
        """Ready addresses in the Service's EndpointSlices (what kube-proxy routes to)."""
        slices = self.discovery.list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"kubernetes.io/service-name={self.name}"
        ).items
        return {
            address
            for s in slices
            for e in s.endpoints or []
            if e.conditions is None or e.conditions.ready is not False
            for address in e.addresses
        }

    def deployment(self) -> kubernetes.client.V1Deployment:
        return self.apps.read_namespaced_deployment(self.name, self.namespace)

    def replica_sets(self) -> list[str]:
        items = self.apps.list_namespaced_replica_set(
            self.namespace, label_selector=f"{constants.LABEL_POOL}={self.name}"
        )
        return sorted(rs.metadata.name for rs in items.items)


def _active_and_warm(pool: Pool) -> tuple[str, str]:
    ips = wait_for(
        lambda: (i := pool.ips()) and constants.ROLE_ACTIVE in i and constants.ROLE_WARM in i and i,
        timeout_s=60,
        what="a Ready active and a Ready warm pod with IPs",
    )
    active_ip, warm_ip = ips[constants.ROLE_ACTIVE][1], ips[constants.ROLE_WARM][1]
    assert active_ip.startswith("10.77.") and warm_ip.startswith("10.77."), ips  # on this test's node
    return active_ip, warm_ip


def test_a_serving_warm_pod_is_in_the_service_and_turning_serve_off_takes_it_out_without_a_rollout(
    api_client, namespace: str, node: str, operator: Operator
) -> None:
    pool = Pool(api_client, namespace, "sv")
    pool.create(_pool("sv", node, serve=True))
    active_ip, warm_ip = _active_and_warm(pool)
    wait_for(lambda: pool.endpoints() == {active_ip, warm_ip}, what="the active and the warm pod in the EndpointSlice")
    before = pool.deployment()
    replica_sets = pool.replica_sets()

    start = time.monotonic()
    pool.set_serve(False)
    wait_for(lambda: pool.endpoints() == {active_ip}, timeout_s=10, what="the warm pod out of the EndpointSlice")
    out_s = time.monotonic() - start

    start = time.monotonic()
    pool.set_serve(True)
    wait_for(lambda: pool.endpoints() == {active_ip, warm_ip}, timeout_s=10, what="the warm pod back in")
    in_s = time.monotonic() - start

    after = pool.deployment()
    # Flipping serve rolls nothing: the same template, the same generation, one ReplicaSet, the same pods.
    assert after.spec.template == before.spec.template
    assert after.metadata.generation == before.metadata.generation
    assert pool.replica_sets() == replica_sets
    assert {ip for _, ip in pool.ips().values()} == {active_ip, warm_ip}
    print(f"serve false -> warm pod out of the EndpointSlice: {out_s:.2f} s; true -> back in: {in_s:.2f} s")


def test_an_operator_upgrade_never_leaves_the_service_without_its_active_pod(
    api_client, namespace: str, node: str, operator: Operator
) -> None:
    pool = Pool(api_client, namespace, "up")
    body = _pool("up", node, serve=False)
    pool.create(body)
    active_ip, warm_ip = _active_and_warm(pool)
    wait_for(lambda: pool.endpoints() == {active_ip}, what="the active pod in the EndpointSlice")

    # What an operator before the serving label left: its Service (role=active, applied by the
    # operator's own field manager) and pods without the label.
    operator.stop()
    obj = pool.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "up")
    old = builders.service(InferencePool.model_validate(obj), OperatorSettings(), by_serving=False)
    old["metadata"]["ownerReferences"] = [
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferencePool", "name": "up", "uid": obj["metadata"]["uid"],
         "controller": True, "blockOwnerDeletion": True}
    ]  # fmt: skip
    Kube(api_client, OperatorSettings().field_manager).apply(old)
    for name, _ in pool.ips().values():
        pool.core.patch_namespaced_pod(name, namespace, {"metadata": {"labels": {constants.LABEL_SERVING: None}}})
    svc = pool.core.read_namespaced_service("up", namespace)
    assert svc.spec.selector == {constants.LABEL_POOL: "up", constants.LABEL_ROLE: "active"}
    wait_for(lambda: pool.endpoints() == {active_ip}, what="the active pod selected by role=active")

    # Watch the EndpointSlice every 20 ms while the new operator takes over.
    seen: list[set[str]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(pool.endpoints())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        operator.start()
        wait_for(
            lambda: (
                pool.core.read_namespaced_service("up", namespace).spec.selector
                == {constants.LABEL_POOL: "up", constants.LABEL_SERVING: "true"}
            ),
            timeout_s=60,
            what="the Service on the serving label",
        )
        wait_for(lambda: len(seen) > 5 and seen[-1] == {active_ip}, what="the EndpointSlice after the switch")
    finally:
        stop.set()
        watcher.join()
    assert all(active_ip in s for s in seen), (
        f"the active pod left the Service in {sum(active_ip not in s for s in seen)} of {len(seen)} reads"
    )
    assert not any(warm_ip in s for s in seen)  # serve is off: the warm pod never served
    print(f"{len(seen)} EndpointSlice reads during the upgrade, the active pod in every one")
