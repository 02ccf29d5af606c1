"""The chart against a real API server: lint, every rendering accepted, installed, upgraded, uninstalled.

The CRD is cluster-scoped and shared with every other cluster test: the chart's copy has the same
content (a unit test holds it to tidegate.api.crd), helm adopts it with --take-ownership, and its
keep policy leaves it in place on uninstall; the test then hands it back (removes helm's ownership
marks) so the next release can adopt it too.
"""

import inspect
import json
import os
import socket
import subprocess
import sys
import urllib.request
import uuid

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.cluster.chart.conftest import CHART
from tests.cluster.conftest import wait_for
from tidegate.cli.main import build_parser
from tidegate.operator import chart_sync, rbac
from tidegate.operator import settings as operator_settings
from tidegate.scaler.cli import settings_from

CRD = "inferencepools.tidegate.dev"
# tidegate publishes no image, so the chart renders only with one named (kwok runs no containers).
IMAGE_REPOSITORY = "registry.example/tidegate"
IMAGE = ("--set", f"image.repository={IMAGE_REPOSITORY}")

VARIANTS = {
    "defaults": [],
    "tls-mtls-digest-namespaces": [
        "--set",
        "scaler.tls.enabled=true",
        "--set",
        "scaler.tls.secretName=scaler-tls",
        "--set",
        "scaler.tls.clientAuth=true",
        "--set",
        "image.digest=sha256:" + "0" * 64,
        "--set",
        "operator.watchNamespaces={inference,batch}",
        "--set",
        "operator.drainTimeoutSeconds=90",
    ],
    "no-crd-no-rbac-one-scaler": [
        "--set",
        "crds.install=false",
        "--set",
        "rbac.create=false",
        "--set",
        "scaler.replicas=1",
        "--set",
        "scaler.podDisruptionBudget.enabled=false",
        "--set",
        "scaler.metricsPort=0",
    ],
    "external-scaler": [
        "--set",
        "scaler.enabled=false",
        "--set",
        "operator.scalerAddress=scaler.elsewhere.svc:9090",
        "--set",
        "monitoring.dashboard.enabled=false",
    ],
}


def _render(helm, release: str, namespace: str, *args: str) -> list[dict]:
    text = helm("template", release, str(CHART), "-n", namespace, *IMAGE, *args).stdout
    return [d for d in yaml.safe_load_all(text) if d]


def _by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def test_helm_lint_strict(helm) -> None:
    helm("lint", "--strict", str(CHART), *IMAGE)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendering_is_accepted_by_the_api_server(helm, kubectl, namespace, variant) -> None:
    release = f"r{uuid.uuid4().hex[:6]}"
    docs = _render(helm, release, namespace, *VARIANTS[variant])
    result = kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager",
        "tidegate-chart-test",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        stdin="\n---\n".join(yaml.safe_dump(d) for d in docs),
    )
    assert result.stdout.count("(server dry run)") == len(docs)


def test_scaler_probes_and_service_speak_grpc(helm, namespace) -> None:
    kinds = _by_kind(_render(helm, "tg", namespace))
    scaler = next(d for d in kinds["Deployment"] if d["metadata"]["name"] == "tg-tidegate-scaler")
    container = scaler["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["grpc"] == {"port": 9090}
    assert container["livenessProbe"]["grpc"] == {"port": 9090}
    assert scaler["spec"]["replicas"] == 2
    service = kinds["Service"][0]
    assert {"name": "grpc", "port": 9090, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"} in service[
        "spec"
    ]["ports"]
    assert kinds["PodDisruptionBudget"][0]["spec"]["minAvailable"] == 1

    operator = next(d for d in kinds["Deployment"] if d["metadata"]["name"] == "tg-tidegate-operator")
    assert operator["spec"]["replicas"] == 1 and operator["spec"]["strategy"] == {"type": "Recreate"}
    op = operator["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in op["env"]}
    assert env["TIDEGATE_SCALER_ADDRESS"] == f"tg-tidegate-scaler.{namespace}.svc:9090"
    assert env["TIDEGATE_SIDECAR_IMAGE"] == op["image"] == f"{IMAGE_REPOSITORY}:0.1.0"
    assert op["args"][:3] == ["operator", "--liveness", "http://0.0.0.0:8080/healthz"]
    assert op["securityContext"]["allowPrivilegeEscalation"] is False
    assert operator["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_tls_mounts_the_secret_and_probes_over_tcp(helm, namespace) -> None:
    kinds = _by_kind(_render(helm, "tg", namespace, *VARIANTS["tls-mtls-digest-namespaces"]))
    scaler = next(d for d in kinds["Deployment"] if d["metadata"]["name"].endswith("-scaler"))
    pod = scaler["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--tls-cert") + 1] == "/etc/tidegate/tls/tls.crt"
    assert args[args.index("--tls-client-ca") + 1] == "/etc/tidegate/tls/ca.crt"
    assert {"name": "tls", "secret": {"secretName": "scaler-tls"}} in pod["volumes"]
    assert "tcpSocket" in pod["containers"][0]["readinessProbe"]  # kubelet gRPC probes cannot do TLS


def test_monitoring_objects_only_where_prometheus_operator_is_served(helm, namespace) -> None:
    assert "PodMonitor" not in _by_kind(_render(helm, "tg", namespace))
    kinds = _by_kind(_render(helm, "tg", namespace, "--api-versions", "monitoring.coreos.com/v1"))
    monitors = {m["metadata"]["name"]: m["spec"] for m in kinds["PodMonitor"]}
    pod_monitor = monitors["tg-tidegate-sidecars"]  # every pool's sidecars, in any namespace
    operator_endpoint = monitors["tg-tidegate-operator"]["podMetricsEndpoints"][0]
    assert (operator_endpoint["port"], operator_endpoint["honorLabels"]) == ("metrics", True)  # pool conditions
    assert pod_monitor["namespaceSelector"] == {"any": True}
    endpoint = pod_monitor["podMetricsEndpoints"][0]
    assert endpoint["port"] == "admission" and endpoint["path"] == "/metrics"
    targets = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert {"namespace", "pod", "node", "pool", "role"} <= targets  # the dashboard groups by these
    assert kinds["ServiceMonitor"][0]["spec"]["endpoints"][0]["port"] == "metrics"
    dashboard = next(c for c in kinds["ConfigMap"] if c["metadata"]["name"] == "tg-tidegate-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["tidegate.json"]) == chart_sync.dashboard()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "scaler.replicas=1"], "must be below scaler.replicas"),
        (["--set", "scaler.tls.enabled=true"], "needs scaler.tls.secretName"),
        (["--set", "scaler.tls.clientAuth=true"], "needs scaler.tls.enabled=true"),
        (["--set", "scaler.metricsPort=9090"], "give them different ports"),
        (["--set", "scaler.enabled=false"], "needs operator.scalerAddress"),
        (["--set", "operator.replicas=2"], "operator/replicas"),
        (["--set", "scaler.tsl.enabled=true"], "additional properties 'tsl' not allowed"),
        (["--set", "image.repository="], "docker build -t REGISTRY/tidegate:0.1.0 . && docker push"),
        (["--set", "alerts.enabled=true"], "alerts.enabled needs the Prometheus Operator's PrometheusRule"),
    ],
)
def test_impossible_values_fail_with_a_reason(helm, args, message) -> None:
    result = helm("template", "tg", str(CHART), *IMAGE, *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr


def _release_objects(api_client, kubectl, namespace: str, release: str) -> dict[str, dict]:
    out = {}
    for kind in ("deployment", "service", "serviceaccount", "poddisruptionbudget", "configmap"):
        items = json.loads(
            kubectl("get", kind, "-n", namespace, "-l", f"app.kubernetes.io/instance={release}", "-o", "json").stdout
        )
        for item in items["items"]:
            out[f"{item['kind']}/{item['metadata']['name']}"] = item
    return out


def _hand_crd_back(kubectl, release: str) -> None:
    crd = json.loads(kubectl("get", "crd", CRD, "-o", "json").stdout)
    if crd["metadata"].get("annotations", {}).get("meta.helm.sh/release-name") == release:
        kubectl("annotate", "crd", CRD, "meta.helm.sh/release-name-", "meta.helm.sh/release-namespace-")
        kubectl("label", "crd", CRD, "app.kubernetes.io/managed-by-", "app.kubernetes.io/instance-")


def _scaler_ready(api_client, kubectl, namespace: str, release: str) -> int | None:
    objects = _release_objects(api_client, kubectl, namespace, release)
    return objects[f"Deployment/{release}-tidegate-scaler"]["status"].get("readyReplicas")


def test_install_upgrade_uninstall(helm, kubectl, api_client, namespace) -> None:
    release = f"tg-{uuid.uuid4().hex[:8]}"
    try:
        helm("install", release, str(CHART), "-n", namespace, *IMAGE, "--take-ownership", "--wait", "--timeout", "180s")
        objects = _release_objects(api_client, kubectl, namespace, release)
        assert {
            f"Deployment/{release}-tidegate-operator",
            f"Deployment/{release}-tidegate-scaler",
            f"Service/{release}-tidegate-scaler",
            f"PodDisruptionBudget/{release}-tidegate-scaler",
            f"ServiceAccount/{release}-tidegate-operator",
            f"ServiceAccount/{release}-tidegate-scaler",
            f"ConfigMap/{release}-tidegate-dashboard",
        } <= set(objects)
        # helm's --wait takes a Deployment as ready at replicas - maxUnavailable ready pods (a CI run
        # saw 1 of 2): wait for both, as after the upgrade below.
        wait_for(
            lambda: _scaler_ready(api_client, kubectl, namespace, release) == 2, timeout_s=60, what="2 scaler replicas"
        )

        # What the API server holds is exactly the operator's and the scaler's one definition.
        role = json.loads(kubectl("get", "clusterrole", f"{release}-tidegate-operator", "-o", "json").stdout)
        assert role["rules"] == [{k: r[k] for k in ("apiGroups", "resources", "verbs")} for r in rbac.RULES]
        scaler_role = json.loads(kubectl("get", "clusterrole", f"{release}-tidegate-scaler", "-o", "json").stdout)
        assert scaler_role["rules"] == chart_sync.SCALER_RULES
        binding = json.loads(kubectl("get", "clusterrolebinding", f"{release}-tidegate-operator", "-o", "json").stdout)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": f"{release}-tidegate-operator", "namespace": namespace}
        ]
        can = kubectl(
            "auth",
            "can-i",
            "patch",
            "inferencepools.tidegate.dev/status",
            f"--as=system:serviceaccount:{namespace}:{release}-tidegate-operator",
            check=False,
        )
        assert can.stdout.strip() == "yes"
        cannot = kubectl(
            "auth",
            "can-i",
            "get",
            "secrets",
            f"--as=system:serviceaccount:{namespace}:{release}-tidegate-scaler",
            check=False,
        )
        assert cannot.stdout.strip() == "no"

        helm(
            "upgrade", release, str(CHART), "-n", namespace, *IMAGE, "--set", "scaler.replicas=3",
            "--wait", "--timeout", "180s",
        )  # fmt: skip
        wait_for(
            lambda: _scaler_ready(api_client, kubectl, namespace, release) == 3,
            timeout_s=60,
            what="3 scaler replicas after the upgrade",
        )
    finally:
        helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "120s", check=False)
        _hand_crd_back(kubectl, release)
    # keep policy: the CRD (and every InferencePool in the cluster) outlives the release
    crd = json.loads(kubectl("get", "crd", CRD, "-o", "json").stdout)
    assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])
    assert kubectl("get", "clusterrole", f"{release}-tidegate-operator", check=False).returncode != 0


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_container_args_and_env_are_what_the_binaries_read(helm, namespace, variant) -> None:
    """The rendered args parse with the real `tidegate` CLI, and every env var is one the operator reads."""
    deployments = _by_kind(_render(helm, "tg", namespace, *VARIANTS[variant])).get("Deployment", [])
    assert deployments
    for dep in deployments:
        container = dep["spec"]["template"]["spec"]["containers"][0]
        args = build_parser().parse_args(container["args"])
        if container["name"] == "scaler":
            settings = settings_from(args)
            assert settings.listen.endswith(":9090") and settings.pods == "kubernetes"
        else:
            env = {e["name"]: e["value"] for e in container["env"]}
            source = inspect.getsource(operator_settings)
            assert all(f'"{name}"' in source for name in env), sorted(env)
            parsed = operator_settings.OperatorSettings.from_env(env)
            assert parsed.scaler_address == env["TIDEGATE_SCALER_ADDRESS"]
            assert parsed.sidecar_image == container["image"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_scaler_started_with_the_charts_args_answers_its_probes(helm, cluster_env, namespace) -> None:
    """What the kubelet's gRPC probe and Prometheus would see, from a real `tidegate scaler` on loopback."""
    scaler = next(
        d for d in _render(helm, "tg", namespace) if d["kind"] == "Deployment" and "scaler" in d["metadata"]["name"]
    )
    args = list(scaler["spec"]["template"]["spec"]["containers"][0]["args"])
    grpc_port, metrics_port = _free_port(), _free_port()
    args[args.index("--listen") + 1] = f"127.0.0.1:{grpc_port}"
    args[args.index("--metrics-port") + 1] = str(metrics_port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidegate.cli.main", *args],
        env={**os.environ, **cluster_env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def serving() -> bool:
            try:
                with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                return reply.status == health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError:
                return proc.poll() is not None and pytest.fail(f"scaler exited with {proc.returncode}")

        wait_for(serving, timeout_s=30, what="the scaler's gRPC health SERVING")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
            assert reply.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=15)
