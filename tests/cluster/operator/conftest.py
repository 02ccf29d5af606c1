"""The operator under test: a real `tidegate operator` process, authenticated as its own
ServiceAccount bound to the ClusterRole from ``tidegate.operator.rbac`` (so every cluster test
also proves that RBAC is enough), and a real gRPC health server standing in for the scaler's
health endpoint."""

import http.server
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import kubernetes
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.cluster.conftest import operator_scope
from tidegate.operator import rbac
from tidegate.scaler.proto import externalscaler_pb2 as pb
from tidegate.scaler.proto import externalscaler_pb2_grpc as pb_grpc

OPERATOR_NS = "tidegate-system"
OPERATOR_SA = "tidegate-operator"


class ScalerHealth:
    """A gRPC health server; ``serving(False)`` makes the scaler look down. ``port`` 0: any free port."""

    def __init__(self, port: int = 0) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, self.server)
        port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.address = f"127.0.0.1:{port}"

    def start(self) -> "ScalerHealth":
        """Serve (subclasses add their services before this)."""
        self.server.start()
        self.serving(True)
        return self

    def serving(self, up: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if up else health_pb2.HealthCheckResponse.NOT_SERVING
        self.servicer.set("", status)

    def stop(self) -> None:
        self.server.stop(grace=None)


class ScalerDecisions:
    """The scaler's side port, standing in: ``GET /decisions/<ns>/<pool>`` from ``self.decisions``."""

    def __init__(self) -> None:
        decisions: dict[str, dict[str, Any]] = {}
        self.decisions = decisions

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                key = self.path.removeprefix("/decisions/")
                body = decisions.get(key)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps(body or {}).encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class StubScaler(ScalerHealth):
    """KEDA's ``externalscaler.ExternalScaler`` answering ``desired`` as the metric (the replica
    count, or the law's ``metric_value``, with an ``AverageValue`` target of 1, as tidegate's scaler
    does) plus gRPC health: what the real KEDA calls when a test needs a known answer rather than
    the scaling law's. ``calls`` records each RPC's name and the ``scalerMetadata`` KEDA sent;
    ``port`` 0 listens on any free port."""

    METRIC = "tidegate-desired-replicas"

    def __init__(self, desired: float, port: int = 0) -> None:
        self.desired = desired
        self.calls: list[tuple[str, dict[str, str]]] = []
        super().__init__(port)
        stub = self

        class Servicer(pb_grpc.ExternalScalerServicer):
            def IsActive(self, request, context):
                stub.calls.append(("IsActive", dict(request.scalerMetadata)))
                return pb.IsActiveResponse(result=stub.is_active())

            def GetMetricSpec(self, request, context):
                stub.calls.append(("GetMetricSpec", dict(request.scalerMetadata)))
                return pb.GetMetricSpecResponse(
                    metricSpecs=[pb.MetricSpec(metricName=StubScaler.METRIC, targetSizeFloat=1.0)]
                )

            def GetMetrics(self, request, context):
                stub.calls.append(("GetMetrics", dict(request.scaledObjectRef.scalerMetadata)))
                return pb.GetMetricsResponse(
                    metricValues=[pb.MetricValue(metricName=request.metricName, metricValueFloat=stub.metric())]
                )

        pb_grpc.add_ExternalScalerServicer_to_server(Servicer(), self.server)

    def is_active(self) -> bool:
        """IsActive's answer (subclasses answer otherwise)."""
        return self.desired > 0

    def metric(self) -> float:
        """GetMetrics' answer (subclasses answer otherwise)."""
        return float(self.desired)


@pytest.fixture(scope="session")
def scaler_decisions() -> Iterator[ScalerDecisions]:
    server = ScalerDecisions()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture(scope="session")
def scaler_health() -> Iterator[ScalerHealth]:
    server = ScalerHealth().start()
    yield server
    server.stop()


def _apply(api_client: kubernetes.client.ApiClient, manifest: dict[str, Any]) -> None:
    from kubernetes.dynamic import DynamicClient

    resource = DynamicClient(api_client).resources.get(api_version=manifest["apiVersion"], kind=manifest["kind"])
    resource.server_side_apply(
        body=manifest,
        name=manifest["metadata"]["name"],
        namespace=manifest["metadata"].get("namespace"),
        field_manager="tidegate-tests",
        force_conflicts=True,
    )


def _service_account_kubeconfig(api_client, admin_kubeconfig: str, path: pathlib.Path) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    _apply(api_client, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NS}})
    _apply(
        api_client,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": OPERATOR_SA, "namespace": OPERATOR_NS}},
    )
    _apply(api_client, rbac.cluster_role())
    _apply(api_client, rbac.cluster_role_binding(OPERATOR_NS, OPERATOR_SA))
    token = core.create_namespaced_service_account_token(
        OPERATOR_SA, OPERATOR_NS, {"spec": {"expirationSeconds": 7200}}
    ).status.token
    admin = yaml.safe_load(pathlib.Path(admin_kubeconfig).read_text())
    cluster = admin["clusters"][0]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": OPERATOR_SA, "user": {"token": token}}],
                "contexts": [{"name": "operator", "context": {"cluster": cluster["name"], "user": OPERATOR_SA}}],
                "current-context": "operator",
            }
        )
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def operator_env(
    cluster_env, api_client, scaler_health, workdir: pathlib.Path, decisions_url: str = ""
) -> dict[str, str]:
    """Environment of an operator process authenticated as its ServiceAccount."""
    kubeconfig = workdir / "kubeconfig"
    _service_account_kubeconfig(api_client, cluster_env["KUBECONFIG"], kubeconfig)
    return {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "TIDEGATE_SCALER_ADDRESS": scaler_health.address,
        "TIDEGATE_SCALER_PROBE_TTL_S": "0",  # no cache: a test that takes the scaler down sees it at once
        "TIDEGATE_RESYNC_SECONDS": "5",
        "TIDEGATE_DRAIN_TIMEOUT_SECONDS": "2",
        "TIDEGATE_GPU_PENDING_SECONDS": "2",
        "TIDEGATE_SIDECAR_IMAGE": "tidegate:test",
        "TIDEGATE_SCALER_DECISIONS_URL": decisions_url,
        "TIDEGATE_METRICS_PORT": str(free_port()),  # /metrics: tidegate_pool_condition
    }


def start_operator(env: dict[str, str], log_path: pathlib.Path) -> subprocess.Popen:
    """Start ``tidegate operator`` (all namespaces; under xdist this worker's, see
    :func:`~tests.cluster.conftest.operator_scope`), appending its output to ``log_path``."""
    with log_path.open("a") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tidegate.cli.main", "operator", *operator_scope()],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def stop_operator(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def operator(cluster_env, api_client, scaler_health, scaler_decisions, tmp_path_factory) -> Iterator[dict[str, str]]:
    """A running operator for one test module (modules that manage their own do not use this)."""
    workdir = tmp_path_factory.mktemp("operator")
    env = operator_env(cluster_env, api_client, scaler_health, workdir, scaler_decisions.url)
    log_path = workdir / "operator.log"
    proc = start_operator(env, log_path)
    try:
        yield env
    finally:
        stop_operator(proc)
        text = log_path.read_text()
        if "Traceback" in text:
            print(f"--- operator log ({log_path}) ---\n{text[-8000:]}")


@pytest.fixture
def operator_for(cluster_env, api_client, scaler, scaler_decisions, tmp_path) -> Iterator[None]:
    """The operator for one test, pointed at the module's own ``scaler`` fixture (a stub the test drives)."""
    env = operator_env(cluster_env, api_client, scaler, tmp_path, scaler_decisions.url)
    proc = start_operator(env, tmp_path / "operator.log")
    try:
        yield
    finally:
        stop_operator(proc)
