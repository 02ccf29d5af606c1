"""Fixtures of the cluster tier: a real API server (e2e/cluster/cluster.sh) and a namespace per test.

The session starts the local control plane if it is not already answering and deletes it
afterwards only if it started it (set TIDEGATE_KEEP_CLUSTER=1 to keep it for the next run).
A cluster that cannot start is an error, never a skip: CI must run this tier.

Under pytest-xdist (``make test`` runs this tier with ``-n``) every worker is a session of its own:
the first worker to need the cluster starts it under a file lock, and the controller
(tests/conftest.py) deletes it after the last worker is done. Each worker names its namespaces
``t-<worker>-...`` and the operators of this tier watch only those (:func:`operator_scope`): an
operator of every namespace would reconcile the pools of the tests other workers run at the same time.
"""

import fcntl
import os
import pathlib
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "e2e" / "cluster" / "cluster.sh"
# Set by the xdist controller (tests/conftest.py) for its workers: a folder for the cluster's lock
# and for the mark that a worker started the cluster (the controller deletes it then).
RUN_DIR_ENV = "TIDEGATE_XDIST_RUN_DIR"
CLUSTER_STARTED = "cluster-started"


def xdist_worker() -> str:
    """This process's pytest-xdist worker id (``gw0``...), or ``""`` when the session is not distributed."""
    return os.environ.get("PYTEST_XDIST_WORKER", "")


def new_namespace_name() -> str:
    """A fresh namespace name of this session: ``t-<10 hex>``, or ``t-<worker>-<10 hex>`` under xdist."""
    worker = xdist_worker()
    return f"t-{worker}-{uuid.uuid4().hex[:10]}" if worker else f"t-{uuid.uuid4().hex[:10]}"


def operator_scope() -> list[str]:
    """The ``tidegate operator`` arguments of this tier's operators: every namespace, or under xdist
    only this worker's (``-n t-gw0-*``, a kopf glob)."""
    worker = xdist_worker()
    return ["-n", f"t-{worker}-*"] if worker else []


def _sh(*args: str) -> str:
    result = subprocess.run([str(CLUSTER_SH), *args], capture_output=True, text=True, check=False)
    if result.returncode != 0 and args[0] != "status":
        raise RuntimeError(f"cluster.sh {' '.join(args)} failed:\n{result.stderr[-4000:]}")
    return result.stdout


@pytest.fixture(scope="session")
def cluster_env() -> Iterator[dict[str, str]]:
    """KUBECONFIG and PATH (with kubectl, helm) of the local cluster, started if needed."""
    run_dir = os.environ.get(RUN_DIR_ENV) if xdist_worker() else None
    with (pathlib.Path(run_dir) / "cluster.lock").open("w") if run_dir else open(os.devnull) as lock:
        if run_dir:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one worker starts it, the others wait for it
        already = subprocess.run([str(CLUSTER_SH), "status"], capture_output=True, check=False).returncode == 0
        kubeconfig = _sh("up").strip().splitlines()[-1]
        if run_dir and not already:
            (pathlib.Path(run_dir) / CLUSTER_STARTED).touch()
    env_lines = _sh("env").splitlines()
    bin_dir = next(line.split("'")[1] for line in env_lines if line.startswith("export PATH="))
    env = {"KUBECONFIG": kubeconfig, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    yield env
    if not already and not run_dir and not os.environ.get("TIDEGATE_KEEP_CLUSTER"):
        _sh("down")


@pytest.fixture(scope="session")
def api_client(cluster_env: dict[str, str]) -> kubernetes.client.ApiClient:
    return kubernetes.config.new_client_from_config(config_file=cluster_env["KUBECONFIG"])


@pytest.fixture
def namespace(api_client: kubernetes.client.ApiClient) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    core = kubernetes.client.CoreV1Api(api_client)
    name = new_namespace_name()
    core.create_namespace({"metadata": {"name": name, "labels": {"tidegate.dev/test": "true"}}})
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def kubectl(cluster_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run kubectl against the local cluster: ``kubectl("get", "pods", "-n", ns)``."""

    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **cluster_env}
        result = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, env=env, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    return run


def wait_for(
    predicate: Callable[[], Any], timeout_s: float = 30.0, interval_s: float = 0.2, what: str = "condition"
) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
