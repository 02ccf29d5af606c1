"""Render the chart with the real helm binary, and name every metric tidegate exports.

helm comes from PATH or from the local control plane's build cache (``make cluster-build``, which
``make test`` runs before the tests). A run without it skips these tests, except under CI, where a
missing binary is a failure: CI must render the chart.
"""

import os
import pathlib
import shutil
import subprocess

import pytest
import yaml

from tidegate.admission.engine import Engine
from tidegate.admission.metrics import SidecarMetrics
from tidegate.api.admission import AdmissionSpec
from tidegate.api.serving import ModelSpec
from tidegate.operator.metrics import PoolConditions
from tidegate.scaler.metrics import DesiredReplicasMetric

CHART = pathlib.Path(__file__).resolve().parents[3] / "charts" / "tidegate"
IMAGE = ("--set", "image.repository=registry.example/team/tidegate")
PROMETHEUS_OPERATOR = ("--api-versions", "monitoring.coreos.com/v1")


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "tidegate/bin"
        candidates = sorted(cache.glob(f"*/{name}"), key=lambda p: p.stat().st_mtime)
        found = str(candidates[-1]) if candidates else None
    if found is None:
        message = f"needs the {name} binary (make cluster-build, or {name} on PATH)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    """``helm <args>`` with no cluster; returns failures too (check ``returncode``)."""
    env = {**os.environ, "KUBECONFIG": os.devnull}
    return subprocess.run([_binary("helm"), *args], capture_output=True, text=True, env=env, check=False, timeout=60)


def render(*args: str, release: str = "tg", namespace: str = "tidegate") -> list[dict]:
    """The documents of ``helm template`` (which must succeed)."""
    result = helm("template", release, str(CHART), "-n", namespace, *args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def promtool() -> str:
    return _binary("promtool")


def exported_metrics() -> set[str]:
    """Every series name the sidecar's, the scaler's and the operator's registries expose (``_total``, ``_bucket``, ...)."""
    engine = Engine(AdmissionSpec(), ModelSpec(name="m"), lambda: 0.0)
    sidecar = SidecarMetrics("p", lambda: engine, lambda: None)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {
        family.name + suffix
        for registry in (sidecar.registry, DesiredReplicasMetric().registry, PoolConditions().registry)
        for family in registry.collect()
        for suffix in suffixes[family.type]
    }


def notes(tmp_path: pathlib.Path, *args: str) -> str:
    """NOTES.txt as ``helm install`` prints it, rendered without a cluster.

    ``helm template`` skips NOTES.txt, so a copy of the chart carries it as a named template that a
    one-document manifest includes.
    """
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    text = (chart / "templates/NOTES.txt").read_text()
    (chart / "templates/NOTES.txt").unlink()
    (chart / "templates/_notes.tpl").write_text('{{- define "test.notes" -}}\n' + text + "{{- end }}\n")
    (chart / "templates/notes.yaml").write_text('kind: Notes\ntext: {{ include "test.notes" . | toJson }}\n')
    result = helm("template", "tg", str(chart), "-n", "tidegate", "--show-only", "templates/notes.yaml", *args)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["text"]
