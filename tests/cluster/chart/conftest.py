"""helm against the local cluster: `helm(...)` runs the helm binary that e2e/cluster builds, with its KUBECONFIG."""

import os
import pathlib
import subprocess
from collections.abc import Callable

import pytest

CHART = pathlib.Path(__file__).resolve().parents[3] / "charts" / "tidegate"


@pytest.fixture
def helm(cluster_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``helm("template", "rel", str(CHART), "--set", "a=b")``; ``check=False`` returns failures too."""

    def run(*args: str, check: bool = True, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **cluster_env}
        result = subprocess.run(
            ["helm", *args], capture_output=True, text=True, env=env, check=False, timeout=timeout_s
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
        return result

    return run
