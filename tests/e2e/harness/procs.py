"""Child processes of the harness: started with a log file, stopped with a bound, never leaked.

Every child gets a parent-death signal (Linux ``PR_SET_PDEATHSIG``, set by util-linux
``setpriv --pdeathsig TERM`` when it is installed): if the harness dies, even by SIGKILL, the
kernel sends the child SIGTERM, so a crashed test run leaves no sidecar holding a pod's address.
It is set by exec-ing through ``setpriv`` rather than in a ``preexec_fn``: a ``preexec_fn`` makes
Python fork, and a forked copy of a process that runs gRPC (a test may hold a gRPC client) aborts in gRPC's
fork handlers; without one, Python spawns with vfork and no handler runs.
"""

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

_SETPRIV = shutil.which("setpriv")


def tidegate(*args: str) -> list[str]:
    """The command line of ``tidegate ARGS`` with this interpreter (no PATH lookup)."""
    return [sys.executable, "-m", "tidegate.cli.main", *args]


def start(cmd: list[str], log_path: pathlib.Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` with stdout+stderr appended to ``log_path``."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [_SETPRIV, "--pdeathsig", "TERM", "--", *cmd] if _SETPRIV else cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )


def stop(proc: subprocess.Popen, grace_s: float = 5.0) -> int:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the usual small race applies)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url`` until it answers (any HTTP status); ``RuntimeError`` if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=0.5):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")
