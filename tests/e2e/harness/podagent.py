"""Plays the kubelet for one namespace: real processes for every Ready pod of an InferencePool.

kwok runs no containers; it reports each pod Running/Ready with a loopback IP (``127.x.y.z``, all
local on Linux). For each such pod the agent starts, bound to that IP:

- the model container: ``tidegate sim-backend`` on ``<podIP>:<model port>``. When the pod's model
  container runs ``tidegate sim-backend ...`` (what the e2e pools and the kind image use), its
  args are kept and only ``--listen`` is replaced; any other image gets a default sim-backend;
- the sidecar: ``tidegate admission --listen <podIP>:<admission port> --upstream
  http://<podIP>:<model port> --config <file> --labels-file <file>``.

It keeps two files per pool / pod in step with the API, as the kubelet does for mounted volumes:
the pool's ConfigMap ``config.yaml`` and the pod's labels in downward-API format
(``key="value"`` lines; the operator relabels ``tidegate.dev/role``). A pod that is deleted,
terminating or not Ready has its processes stopped. The agent also plays the readiness probe
that feeds a Service's endpoints: :meth:`endpoints` lists the pods the Service selects
(``tidegate.dev/serving=true``; ``role=active`` for a pod without that label) whose sidecar
answers ``/readyz`` 200 (EndpointSlices refuse loopback IPs, so the real Service stays empty and
clients route to these URLs, as kube-proxy would).

Differences from a kubelet, on purpose: files are refreshed within ``poll_s`` (a kubelet takes
up to its sync period, ~1 min, for downward-API volumes); a process that exits is recorded in
:attr:`PodAgent.crashes` and not restarted, so a test sees it.
"""

import dataclasses
import logging
import pathlib
import subprocess
import threading
import time
import urllib.error
import urllib.request

import kubernetes

from tests.e2e.harness import procs
from tidegate.api import constants
from tidegate.operator import names

log = logging.getLogger(__name__)


@dataclasses.dataclass
class PodProcs:
    """The processes of one pod, and what the agent last saw of it (monotonic seconds)."""

    name: str
    pool: str
    ip: str
    sidecar_port: int
    sim: subprocess.Popen
    sidecar: subprocess.Popen
    labels_path: pathlib.Path
    role: str = ""
    serving: str | None = None  # the tidegate.dev/serving label; None: not labelled
    ready: bool = False  # sidecar /readyz answered 200 on the last probe
    ready_since: float | None = None  # when /readyz last turned 200 (monotonic)

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.sidecar_port}"


def _labels_text(labels: dict[str, str]) -> str:
    """Downward-API ``metadata.labels`` file: ``key="value"`` per line, sorted by key."""
    return "".join(f'{k}="{v}"\n' for k, v in sorted(labels.items()))


def _write_if_changed(path: pathlib.Path, text: str) -> bool:
    """Atomic replace (as the kubelet's symlink swap): a reader never sees half a file."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return True


def _port(container: kubernetes.client.V1Container, name: str, default: int) -> int:
    return next((p.container_port for p in container.ports or [] if p.name == name), default)


def _is_ready(pod: kubernetes.client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _readyz(url: str, timeout_s: float = 0.3) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=timeout_s) as resp:
            return resp.status == 200
    except (OSError, urllib.error.HTTPError):
        return False


class PodAgent:
    """Runs and stops pod processes for the pools in ``namespace``; a background thread polls every ``poll_s``."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        namespace: str,
        workdir: pathlib.Path,
        poll_s: float = 0.1,
        sidecar_image: str | None = None,
    ) -> None:
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.namespace = namespace
        self.workdir = workdir
        self.poll_s = poll_s
        self.pods: dict[str, PodProcs] = {}
        self.crashes: list[str] = []  # "pod/container exited N" lines
        self.errors: list[str] = []  # sync failures (API errors), for the report
        self.sidecar_image = sidecar_image
        self.foreign: set[str] = set()  # pods whose sidecar image is not sidecar_image: another operator made them
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pod-agent", daemon=True)

    # ---- what tests read -------------------------------------------------------------------------

    def running(self, pool: str | None = None) -> dict[str, PodProcs]:
        """Pods with live processes (all pools, or one)."""
        with self._lock:
            return {n: p for n, p in self.pods.items() if pool is None or p.pool == pool}

    def endpoints(self, pool: str) -> list[str]:
        """The Service's endpoints as kube-proxy would route: serving pods whose sidecar is ready."""
        return [
            p.url
            for p in self.running(pool).values()
            if p.ready and (p.serving == "true" if p.serving is not None else p.role == constants.ROLE_ACTIVE)
        ]

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then every process (bounded: a few seconds per pod at most)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._lock:
            names = list(self.pods)
        for name in names:
            self._stop_pod(name)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                log.warning("pod agent sync failed: %s", exc)
            self._stop.wait(self.poll_s)

    # ---- one pass --------------------------------------------------------------------------------

    def sync(self) -> None:
        """Converge processes and files to the pods and ConfigMaps the API reports now."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=constants.LABEL_POOL).items
        wanted: dict[str, kubernetes.client.V1Pod] = {}
        for pod in pods:
            if pod.metadata.deletion_timestamp is None and pod.status.pod_ip and _is_ready(pod):
                wanted[pod.metadata.name] = pod
        for name in [n for n in self.running() if n not in wanted]:
            self._stop_pod(name)
        configs = self._sync_configs({p.metadata.labels[constants.LABEL_POOL] for p in wanted.values()})
        for name, pod in wanted.items():
            pool = pod.metadata.labels[constants.LABEL_POOL]
            if pool not in configs:
                continue  # no ConfigMap yet: the kubelet would not start the pod either
            if name not in self.pods:
                self._start_pod(pod, configs[pool])
            current = self.pods[name]
            _write_if_changed(current.labels_path, _labels_text(pod.metadata.labels or {}))
            current.role = pod.metadata.labels.get(constants.LABEL_ROLE, "")
            current.serving = pod.metadata.labels.get(constants.LABEL_SERVING)
        self._check_processes()
        self._probe()

    def _sync_configs(self, pools: set[str]) -> dict[str, pathlib.Path]:
        out = {}
        for pool in pools:
            try:
                cm = self.core.read_namespaced_config_map(f"{pool}-admission", self.namespace)  # names.config_map_name
            except kubernetes.client.ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            text = (cm.data or {}).get(names.CONFIG_FILE)
            if text is None:
                continue
            path = self.workdir / pool / names.CONFIG_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_if_changed(path, text)
            out[pool] = path
        return out

    def _start_pod(self, pod: kubernetes.client.V1Pod, config: pathlib.Path) -> None:
        name, ip = pod.metadata.name, pod.status.pod_ip
        containers = pod.spec.containers
        model = next((c for c in containers if c.name == "model"), containers[0])
        sidecar = next(c for c in [*(pod.spec.init_containers or []), *containers] if c.name == names.SIDECAR_CONTAINER)
        model_port = _port(model, "model", 8000)
        sidecar_port = _port(sidecar, "admission", 8081)
        if self.sidecar_image and sidecar.image != self.sidecar_image:
            self.foreign.add(f"{name} (sidecar image {sidecar.image})")
        pool = pod.metadata.labels[constants.LABEL_POOL]
        pod_dir = self.workdir / pool / name
        pod_dir.mkdir(parents=True, exist_ok=True)
        labels_path = pod_dir / "labels"
        _write_if_changed(labels_path, _labels_text(pod.metadata.labels or {}))
        command = list(model.command or [])
        if command and pathlib.Path(command[0]).name == "tidegate" and command[1:2] == ["sim-backend"]:
            sim_cmd = procs.tidegate(*command[1:], *(model.args or []), "--listen", f"{ip}:{model_port}")
        else:  # a real model server image: stand a default simulator in its place
            sim_cmd = procs.tidegate("sim-backend", "--listen", f"{ip}:{model_port}")
        sim = procs.start(sim_cmd, pod_dir / "sim-backend.log")
        side_cmd = procs.tidegate(
            "admission", "--config", str(config), "--upstream", f"http://{ip}:{model_port}",
            "--listen", f"{ip}:{sidecar_port}", "--labels-file", str(labels_path),
            "--drain-grace", "2", "--log-level", "WARNING",
        )  # fmt: skip
        side = procs.start(side_cmd, pod_dir / "admission.log", env={"POD_NAME": name})
        with self._lock:
            self.pods[name] = PodProcs(name, pool, ip, sidecar_port, sim, side, labels_path)
        log.info("pod %s (%s): started sim-backend and sidecar", name, ip)

    def _stop_pod(self, name: str) -> None:
        """Stop a pod's processes, then forget it: :meth:`running` lists a pod until both have exited."""
        with self._lock:
            pod = self.pods.get(name)
        if pod is None:
            return
        for proc in (pod.sidecar, pod.sim):
            if proc.poll() is None:
                proc.terminate()
        for proc in (pod.sidecar, pod.sim):
            procs.stop(proc, grace_s=4.0)
        with self._lock:
            if self.pods.get(name) is pod:
                del self.pods[name]
        log.info("pod %s: stopped", name)

    def _check_processes(self) -> None:
        for pod in list(self.running().values()):
            for what, proc in (("sim-backend", pod.sim), ("admission", pod.sidecar)):
                code = proc.poll()
                line = f"{pod.name}/{what} exited {code}"
                if code is not None and line not in self.crashes:
                    self.crashes.append(line)

    def _probe(self) -> None:
        now = time.monotonic()
        for pod in list(self.running().values()):
            ready = _readyz(pod.url)
            if ready and not pod.ready:
                pod.ready_since = now
            pod.ready = ready
