"""Fixtures of the real-engine tier: llama.cpp's ``llama-server`` with a real model, and the
admission sidecar in front of it, run as the pod runs it (``tidegate admission`` with the config
file the operator writes into the pool's ConfigMap).

The server is built and the model fetched by ``e2e/engines/build-llamacpp.sh`` (cached under
``${XDG_CACHE_HOME:-~/.cache}/tidegate``; about 14 CPU-minutes the first time). A server that
cannot be built or started is an error, never a skip: CI runs this tier.

Server shape: ``--parallel 2 --ctx-size 2048``, so 2 slots of 1024 tokens each (llama.cpp splits
``--ctx-size`` between the slots), ``--metrics --slots`` for the load signals the sidecar reads.
``--threads 1``: llama.cpp's decode threads meet at a barrier every step, so with 2 threads on a
2-core machine shared with the sidecar and the tests one busy core slows it twenty-fold (measured
here: 58 tokens/s with 1 thread, 3 with 2, while a compiler ran); one thread leaves a core free.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tidegate.api.pool import InferencePool
from tidegate.operator import names
from tidegate.operator.builders import configmap

from .helpers import CTX_PER_SLOT, MODEL_ALIAS, SLOTS

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = REPO / "e2e" / "engines" / "build-llamacpp.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; HTTP errors are answers, not exceptions."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str) -> Any:
    status, body = get(url)
    assert status == 200, (url, status, body[:500])
    return json.loads(body)


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes], what: str) -> None:
    """Poll ``url`` until it answers 200; fail with the process's log if it exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if get(url, 1.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer {url} within {timeout_s} s")


@dataclass(frozen=True)
class LlamaServer:
    url: str
    binary: str
    model: str
    log: pathlib.Path

    def metric(self, name: str) -> float:
        """One ``llamacpp:`` gauge/counter from the server's own /metrics (identity encoding)."""
        text = get(self.url + "/metrics")[1].decode()
        for line in text.splitlines():
            if line.startswith(f"llamacpp:{name} ") or line.startswith(f"llamacpp:{name}{{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"llamacpp:{name} not in /metrics")

    def busy_slots(self) -> int:
        return sum(1 for slot in get_json(self.url + "/slots") if slot.get("is_processing"))


@pytest.fixture(scope="session")
def llama_binaries() -> tuple[str, str]:
    """(llama-server path, GGUF model path), built/fetched on first use."""
    result = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD} failed:\n{result.stderr[-4000:]}")
    binary, model = result.stdout.strip().splitlines()[-2:]
    return binary, model


def llama_args(
    binary: str, model: str, port: int, parallel: int = SLOTS, ctx_size: int = SLOTS * CTX_PER_SLOT
) -> list[str]:
    """llama-server's command line for the tests (the module docstring's shape by default)."""
    return [
        binary, "-m", model, "--alias", MODEL_ALIAS, "--host", "127.0.0.1", "--port", str(port),
        "--ctx-size", str(ctx_size), "--parallel", str(parallel), "--threads", "1",
        "--metrics", "--slots", "--no-webui", "--seed", "7",
    ]  # fmt: skip


@pytest.fixture(scope="session")
def llama_server(llama_binaries: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """One llama-server for the session (2 slots x 1024 tokens, metrics and /slots on)."""
    binary, model = llama_binaries
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "llama-server.log"
    args = llama_args(binary, model, port)
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    server = LlamaServer(f"http://127.0.0.1:{port}", binary, model, log)
    try:
        wait_http(server.url + "/health", 120, proc, "llama-server")
        yield server
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n--- llama-server log ---\n{log.read_text(errors='replace')[-4000:]}") from exc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def pool_manifest(
    admission: dict[str, Any] | None = None, server: dict[str, Any] | None = None, **model: Any
) -> dict[str, Any]:
    """An InferencePool for the test server, as a user would write it for llama.cpp."""
    return {
        "apiVersion": "tidegate.dev/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "smol", "namespace": "default"},
        "spec": {
            "model": {"name": MODEL_ALIAS, "engine": "llamacpp", "maxContextTokens": CTX_PER_SLOT, **model},
            "server": {"image": "ghcr.io/ggml-org/llama.cpp:server", "port": 8080, **(server or {})},
            "admission": {"telemetry": {"pollIntervalMs": 100}, **(admission or {})},
        },
    }


@dataclass
class RealSidecar:
    url: str
    proc: subprocess.Popen[bytes]
    log: pathlib.Path

    def stats(self) -> dict[str, Any]:
        return get_json(self.url + "/tidegate/stats")

    def metric(self, name: str) -> float:
        """Sum of all samples of one sidecar metric (0 when it has no sample yet)."""
        total = 0.0
        for line in get(self.url + "/metrics")[1].decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def start_sidecar(llama_server: LlamaServer, tmp_path: pathlib.Path) -> Iterator[Callable[..., RealSidecar]]:
    """``start_sidecar(admission={...}, server={...}, upstream=None, **model)``: ``tidegate admission`` as a
    process, configured with the ConfigMap the operator builds for :func:`pool_manifest`, in front of
    the session's server (or of ``upstream``, a server the test runs itself)."""
    started: list[RealSidecar] = []

    def start(
        admission: dict[str, Any] | None = None,
        server: dict[str, Any] | None = None,
        upstream: str | None = None,
        **model: Any,
    ) -> RealSidecar:
        pool = InferencePool.model_validate(pool_manifest(admission, server, **model))
        config = configmap.admission_config_map(pool)["data"][names.CONFIG_FILE]
        path = tmp_path / f"config-{len(started)}.yaml"
        path.write_text(config)
        assert yaml.safe_load(config)["model"]["engine"] == "llamacpp"
        port = free_port()
        log = tmp_path / f"sidecar-{len(started)}.log"
        args = [
            sys.executable, "-m", "tidegate.cli.main", "admission", "--config", str(path),
            "--upstream", upstream or llama_server.url, "--listen", f"127.0.0.1:{port}", "--event-loop", "asyncio",
        ]  # fmt: skip
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
            )
        sidecar = RealSidecar(f"http://127.0.0.1:{port}", proc, log)
        started.append(sidecar)
        try:
            wait_http(sidecar.url + "/readyz", 30, proc, "tidegate admission")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n--- sidecar log ---\n{sidecar.log_text()[-4000:]}") from exc
        return sidecar

    yield start
    for sidecar in started:
        sidecar.proc.terminate()
        try:
            sidecar.proc.wait(10)
        except subprocess.TimeoutExpired:
            sidecar.proc.kill()


def wait_until(check: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> Any:
    """Poll ``check`` every 50 ms until truthy; fail after ``timeout_s`` (never a bare sleep)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)
