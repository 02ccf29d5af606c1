"""Fixtures of the cluster tier: a real API server (e2e/cluster/cluster.sh) and a namespace per test.

The session starts the local control plane if it is not already answering and deletes it
afterwards only if it started it (set TIDEGATE_KEEP_CLUSTER=1 to keep it for the next run).
A cluster that cannot start is an error, never a skip: CI must run this tier.
"""

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


def _sh(*args: str) -> str:
    result = subprocess.run([str(CLUSTER_SH), *args], capture_output=True, text=True, check=False)
    if result.returncode != 0 and args[0] != "status":
        raise RuntimeError(f"cluster.sh {' '.join(args)} failed:\n{result.stderr[-4000:]}")
    return result.stdout


@pytest.fixture(scope="session")
def cluster_env() -> Iterator[dict[str, str]]:
    """KUBECONFIG and PATH (with kubectl, helm) of the local cluster, started if needed."""
    already = subprocess.run([str(CLUSTER_SH), "status"], capture_output=True, check=False).returncode == 0
    kubeconfig = _sh("up").strip().splitlines()[-1]
    env_lines = _sh("env").splitlines()
    bin_dir = next(line.split("'")[1] for line in env_lines if line.startswith("export PATH="))
    env = {"KUBECONFIG": kubeconfig, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    yield env
    if not already and not os.environ.get("TIDEGATE_KEEP_CLUSTER"):
        _sh("down")


@pytest.fixture(scope="session")
def api_client(cluster_env: dict[str, str]) -> kubernetes.client.ApiClient:
    return kubernetes.config.new_client_from_config(config_file=cluster_env["KUBECONFIG"])


@pytest.fixture
def namespace(api_client: kubernetes.client.ApiClient) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    core = kubernetes.client.CoreV1Api(api_client)
    name = f"t-{uuid.uuid4().hex[:10]}"
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
