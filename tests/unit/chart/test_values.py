"""values.yaml is documented field by field and valid against values.schema.json, which rejects mistakes."""

import copy
import json
import pathlib

import jsonschema
import pytest
import yaml

CHART = pathlib.Path(__file__).resolve().parents[3] / "charts" / "tidegate"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def _errors(values: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(values)]


def test_chart_version_and_app_version_follow_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (CHART.parents[1] / "pyproject.toml").read_text()
    version = next(line.split('"')[1] for line in pyproject.splitlines() if line.startswith("version ="))
    assert chart["appVersion"] == version


def test_default_values_are_valid() -> None:
    assert _errors(VALUES) == []


def test_every_value_is_documented() -> None:
    """Each key line in values.yaml has a comment right above it (possibly above a parent's comment block)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        value = stripped.split(":", 1)[1].strip()
        is_parent = value == "" and i + 1 < len(lines) and len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent
        previous = lines[i - 1].strip() if i else ""
        if not previous.startswith("#") and not is_parent:
            undocumented.append(f"line {i + 1}: {stripped}")
    # Children of free-form maps (resources, securityContexts, labels) are examples, not fields.
    free_form = (
        "requests:",
        "limits:",
        "cpu:",
        "memory:",
        "seccompProfile:",
        "type: RuntimeDefault",
        "runAsNonRoot:",
        "runAsUser:",
        "runAsGroup:",
        "fsGroup:",
        "allowPrivilegeEscalation:",
        "readOnlyRootFilesystem:",
        "capabilities:",
        "drop:",
        "grafana_dashboard:",
    )
    assert [u for u in undocumented if not u.split(": ", 1)[1].startswith(free_form)] == []


def _with(path: str, value) -> dict:
    values = copy.deepcopy(VALUES)
    node = values
    *parents, leaf = path.split(".")
    for key in parents:
        node = node[key]
    node[leaf] = value
    return values


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        ("operator.replicas", 2, "operator/replicas"),
        ("scaler.replicas", 0, "scaler/replicas"),
        ("scaler.port", 70000, "scaler/port"),
        ("scaler.logLevel", "chatty", "scaler/logLevel"),
        ("scaler.tls.enable", True, "Additional properties"),
        ("image.digest", "latest", "image/digest"),
        ("image.pullPolicy", "Sometimes", "image/pullPolicy"),
        ("operator.scalerAddress", "http://scaler:9090", "operator/scalerAddress"),
        ("monitoring.podMonitor.interval", "15", "monitoring/podMonitor/interval"),
        ("crds.install", "yes", "crds/install"),
        ("alerts.enabled", "true", "alerts/enabled"),
        ("alerts.for.breakerOpen", "5 minutes", "alerts/for/breakerOpen"),
        ("alerts.capacityRejectRate", 2, "alerts/capacityRejectRate"),
        ("alerts.capacityRejectRate", "lots", "alerts/capacityRejectRate"),
        ("alerts.runbookUrl", "wiki/troubleshooting", "alerts/runbookUrl"),
    ],
)
def test_schema_rejects_mistakes(path: str, value, complaint: str) -> None:
    errors = _errors(_with(path, value))
    assert errors and any(complaint in e for e in errors), errors


def test_schema_accepts_a_production_override() -> None:
    values = _with("scaler.tls", {"enabled": True, "secretName": "scaler-tls", "clientAuth": True})
    values["image"]["digest"] = "sha256:" + "a" * 64
    values["operator"]["watchNamespaces"] = ["inference", "batch"]
    values["operator"]["drainTimeoutSeconds"] = 120
    values["scaler"]["replicas"] = 3
    values["image"]["repository"] = "registry.example.com:5000/ml/tidegate"
    values["alerts"] = {**values["alerts"], "enabled": True, "capacityRejectRate": "0.1", "labels": {"release": "kps"}}
    assert _errors(values) == []
