"""The local launcher: tidegate installed with helm, its operator and scaler running as processes.

On the local control plane (e2e/cluster/cluster.sh: real API server, kwok nodes) nothing the
chart deploys ever runs: kwok reports the operator and scaler pods Ready but runs no container.
So :class:`Launcher`:

1. ``helm install`` the chart into a fresh namespace (``crds.install=false``: cluster.sh
   already applies the CRD, shared with other tests);
2. runs ``tidegate scaler --listen 127.0.0.1:<port> --pods kubernetes`` authenticated as the
   chart's scaler ServiceAccount (a token minted for it), so the chart's RBAC is exercised;
3. runs ``tidegate operator -n <namespace>`` as the chart's operator ServiceAccount, with
   ``TIDEGATE_SCALER_ADDRESS`` at that scaler (ScaledObjects point KEDA there);
4. runs the :class:`~tests.e2e.harness.podagent.PodAgent` (real sidecar + sim-backend per pod).

The operator watches only the launcher's namespace. Operators that other test runs start for all
namespaces on the same cluster would reconcile these pools too (kopf ``--standalone``: both act;
pods churn, ScaledObjects point elsewhere); the pod agent flags their pods by sidecar image
(:attr:`PodAgent.foreign`). On a shared development cluster, give the e2e suite its own:
``TIDEGATE_CLUSTER_NAME=tidegate-e2e``. Everything stops on :meth:`Launcher.close` (and on any
failure while starting); children die with the harness even if it is killed (PDEATHSIG).

By hand::

    eval "$(e2e/cluster/cluster.sh env)"
    .venv/bin/python -m tests.e2e.harness.launcher        # Ctrl-C stops everything
    kubectl -n <printed namespace> apply -f my-pool.yaml     # the real KEDA and HPA then scale it
"""

import argparse
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
import uuid

import kubernetes
import yaml

from tests.e2e.harness import procs
from tests.e2e.harness.podagent import PodAgent

REPO = pathlib.Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "tidegate"
SIDECAR_IMAGE = "tidegate:e2e"  # what our operator writes; pods with another were made by a foreign operator


def _service_account_kubeconfig(api_client, admin_kubeconfig: str, namespace: str, sa: str, path: pathlib.Path) -> None:
    """A kubeconfig that authenticates as ``namespace/sa`` with a freshly minted token (2 h)."""
    token = (
        kubernetes.client.CoreV1Api(api_client)
        .create_namespaced_service_account_token(sa, namespace, {"spec": {"expirationSeconds": 7200}})
        .status.token
    )
    admin = yaml.safe_load(pathlib.Path(admin_kubeconfig).read_text())
    cluster = admin["clusters"][0]
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": cluster["name"], "user": sa, "namespace": namespace}}],
        "current-context": sa,
    }
    path.write_text(yaml.safe_dump(doc))


class Launcher:
    """tidegate on the local cluster at ``kubeconfig``; use as a context manager.

    ``env``: extra environment for helm/kubectl (PATH with the cluster's binaries).
    ``operator_env``: extra ``TIDEGATE_*`` settings for the operator (tests shorten drain timeouts).
    """

    def __init__(
        self,
        kubeconfig: str,
        env: dict[str, str] | None = None,
        workdir: pathlib.Path | None = None,
        operator_env: dict[str, str] | None = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.env = {**os.environ, **(env or {}), "KUBECONFIG": kubeconfig}
        self.suffix = uuid.uuid4().hex[:8]
        self.namespace = f"e2e-{self.suffix}"
        self.release = f"tg-{self.suffix}"
        self._own_workdir = workdir is None
        self.workdir = workdir or pathlib.Path(tempfile.mkdtemp(prefix="tidegate-e2e-"))
        self.operator_env = operator_env or {}
        self.start_timeout_s = start_timeout_s
        self.api_client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
        self.scaler: subprocess.Popen | None = None
        self.operator: subprocess.Popen | None = None
        self.agent: PodAgent | None = None
        self.scaler_address = ""
        self.installed = False

    # ---- helpers ---------------------------------------------------------------------------------

    def helm(self, *args: str, timeout_s: float = 180) -> str:
        result = subprocess.run(
            ["helm", *args], capture_output=True, text=True, env=self.env, check=False, timeout=timeout_s
        )
        if result.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        return result.stdout

    def _service_account(self, component: str) -> str:
        apps = kubernetes.client.AppsV1Api(self.api_client)
        deps = apps.list_namespaced_deployment(
            self.namespace, label_selector=f"app.kubernetes.io/component={component}"
        ).items
        if not deps:
            raise RuntimeError(f"the chart made no {component} Deployment in {self.namespace}")
        return deps[0].spec.template.spec.service_account_name

    def log_tail(self, name: str, chars: int = 4000) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    # ---- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> "Launcher":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self.helm(
            "install", self.release, str(CHART), "-n", self.namespace, "--create-namespace",
            "--set", "crds.install=false", "--set", "scaler.replicas=1", "--set", "image.repository=registry.example/tidegate",
            "--set", "scaler.podDisruptionBudget.enabled=false",
        )  # fmt: skip
        self.installed = True
        for component in ("scaler", "operator"):
            _service_account_kubeconfig(
                self.api_client, self.kubeconfig, self.namespace, self._service_account(component),
                self.workdir / f"{component}.kubeconfig",
            )  # fmt: skip
        self._metrics_port = procs.free_port()
        self.scaler_address = f"127.0.0.1:{procs.free_port()}"
        self.scaler_metrics_url = f"http://127.0.0.1:{self._metrics_port}"
        self.start_scaler()
        env = {
            "KUBECONFIG": str(self.workdir / "operator.kubeconfig"),
            "TIDEGATE_SCALER_ADDRESS": self.scaler_address,
            "TIDEGATE_SCALER_PROBE_TTL_S": "1",
            "TIDEGATE_SCALER_DECISIONS_URL": self.scaler_metrics_url,
            "TIDEGATE_RESYNC_SECONDS": "5",
            "TIDEGATE_SIDECAR_IMAGE": SIDECAR_IMAGE,
            **self.operator_env,
        }
        self.operator = procs.start(
            procs.tidegate("operator", "-n", self.namespace), self.workdir / "operator.log", env=env
        )
        self.agent = PodAgent(self.api_client, self.namespace, self.workdir / "pods", sidecar_image=SIDECAR_IMAGE)
        self.agent.start()

    def start_scaler(self) -> None:
        """Start ``tidegate scaler`` at :attr:`scaler_address` (again, after :meth:`kill_scaler`)."""
        self.scaler = procs.start(
            procs.tidegate(
                "scaler", "--listen", self.scaler_address, "--pods", "kubernetes",
                "--kubeconfig", str(self.workdir / "scaler.kubeconfig"),
                "--min-refresh-s", "0.5", "--sidecar-timeout-s", "1", "--metrics-port", str(self._metrics_port),
            ),
            self.workdir / "scaler.log",
        )  # fmt: skip
        procs.wait_http(self.scaler_metrics_url + "/healthz", self.start_timeout_s, self.scaler)

    def kill_scaler(self) -> None:
        """SIGKILL the scaler, as a crashed or evicted scaler pod goes away."""
        if self.scaler is not None:
            self.scaler.kill()
            self.scaler.wait()

    def close(self) -> None:
        """Stop the agent (and every pod process), the operator, the scaler; uninstall; drop the namespace."""
        if self.agent is not None:
            self.agent.stop()
        for proc in (self.operator, self.scaler):
            if proc is not None:
                procs.stop(proc, grace_s=10.0)
        if self.installed:
            self.installed = False
            try:
                self.helm("uninstall", self.release, "-n", self.namespace, "--timeout", "60s")
            finally:
                kubernetes.client.CoreV1Api(self.api_client).delete_namespace(
                    self.namespace, propagation_policy="Background"
                )
        if self._own_workdir and not os.environ.get("TIDEGATE_E2E_KEEP_LOGS"):
            shutil.rmtree(self.workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description="Run tidegate on the local cluster until Ctrl-C.")
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), required=not os.environ.get("KUBECONFIG"))
    args = parser.parse_args()
    with Launcher(args.kubeconfig, workdir=pathlib.Path(tempfile.mkdtemp(prefix="tidegate-e2e-"))) as launcher:
        print(f"namespace {launcher.namespace}; scaler {launcher.scaler_address}; logs in {launcher.workdir}")
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            print("stopping")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
