"""The chart's generated files (CRD, ClusterRoles, dashboard) are current, and say what their sources say."""

import pathlib
import re

import yaml

from tidegate.operator import chart_sync, rbac

CHART = pathlib.Path(__file__).resolve().parents[3] / "charts" / "tidegate"


def _without_template_lines(text: str) -> dict:
    """The YAML of a generated template with its `{{ ... }}`-only lines dropped and inline actions blanked."""
    kept = [line for line in text.splitlines() if not re.fullmatch(r"\s*\{\{.*\}\}\s*", line)]
    return yaml.safe_load(re.sub(r"\{\{.*?\}\}", "x", "\n".join(kept)))


def test_committed_chart_files_are_current() -> None:
    assert chart_sync.stale(CHART) == [], "chart files are stale: run `python -m tidegate.operator.chart_sync`"


def test_check_mode_reports_a_stale_file(tmp_path, capsys) -> None:
    assert chart_sync.main(["--chart", str(tmp_path)]) == 0  # writes every file
    assert chart_sync.main(["--check", "--chart", str(tmp_path)]) == 0
    (tmp_path / "templates/operator/clusterrole.yaml").write_text("# edited by hand\n")
    assert chart_sync.main(["--check", "--chart", str(tmp_path)]) == 1
    assert "templates/operator/clusterrole.yaml" in capsys.readouterr().err


def test_chart_operator_clusterrole_rules_are_the_operators() -> None:
    role = _without_template_lines((CHART / "templates/operator/clusterrole.yaml").read_text())
    assert role["kind"] == "ClusterRole"
    assert role["rules"] == rbac.RULES


def test_chart_scaler_clusterrole_is_read_only() -> None:
    role = _without_template_lines((CHART / "templates/scaler/clusterrole.yaml").read_text())
    assert role["rules"] == chart_sync.SCALER_RULES
    verbs = {verb for rule in role["rules"] for verb in rule["verbs"]}
    assert verbs == {"get", "list", "watch"}
    assert {"pods"} <= {res for rule in role["rules"] for res in rule["resources"]}


def test_chart_crd_is_the_generated_crd_and_survives_uninstall() -> None:
    text = (CHART / "templates/crds/inferencepools.tidegate.dev.yaml").read_text()
    doc = _without_template_lines(text)
    expected = yaml.safe_load(chart_sync.CRD_FILE.read_text())  # held to the models by tests/unit/test_crd.py
    assert doc["spec"] == expected["spec"]
    assert doc["metadata"]["name"] == expected["metadata"]["name"]
    assert doc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert "{{- if .Values.crds.install }}" in text
