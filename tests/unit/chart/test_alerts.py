"""The chart's PrometheusRule: off by default, real PromQL over metrics tidegate exports, and each
alert fires on the state it names (``promtool test rules`` over synthetic series) and not before."""

import pathlib
import re
import subprocess

import promql_parser
import pytest
import yaml

from tests.unit.chart.helm import CHART, IMAGE, PROMETHEUS_OPERATOR, exported_metrics, helm, promtool, render
from tidegate.admission.breaker import BreakerState
from tidegate.scaler.law import Reason as LawReason

ALERTS = ("--set", "alerts.enabled=true")
PROMETHEUS_BUILTINS = {"up"}  # target health, written by Prometheus for every scrape target
NAMES = {
    "TidegateScalerDown",
    "TidegateScalerStatsStale",
    "TidegatePoolSaturatedAtMaxReplicas",
    "TidegateCircuitBreakerOpen",
    "TidegateTelemetryUnreadable",
    "TidegatePoolDegraded",
}


def _rule_doc(*args: str) -> dict:
    docs = [d for d in render(*IMAGE, *PROMETHEUS_OPERATOR, *ALERTS, *args) if d["kind"] == "PrometheusRule"]
    assert len(docs) == 1
    return docs[0]


def _rules(*args: str) -> dict[str, dict]:
    return {r["alert"]: r for g in _rule_doc(*args)["spec"]["groups"] for r in g["rules"]}


def _selectors(expr: str) -> list[promql_parser.VectorSelector]:
    found = []

    def visit(node) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(promql_parser.parse(expr), pre_visit=visit)
    return found


def test_off_by_default() -> None:
    assert "PrometheusRule" not in {d["kind"] for d in render(*IMAGE, *PROMETHEUS_OPERATOR)}


def test_needs_the_prometheus_operator() -> None:
    result = helm("template", "tg", str(CHART), *IMAGE, *ALERTS)
    assert result.returncode != 0
    assert "alerts.enabled needs the Prometheus Operator's PrometheusRule" in result.stderr


def test_the_alerts_the_issue_lists() -> None:
    assert set(_rules()) == NAMES
    # the scaler's own health is only visible where its ServiceMonitor scrapes it
    unscraped = _rules("--set", "monitoring.serviceMonitor.enabled=false")
    assert set(unscraped) == NAMES - {"TidegateScalerDown"}
    # a pool's conditions are the operator's gauge: no alert where the operator is not scraped
    for off in ("operator.metricsPort=0", "monitoring.podMonitor.enabled=false", "operator.enabled=false"):
        assert set(_rules("--set", off)) == NAMES - {"TidegatePoolDegraded"}, off


def test_every_expression_parses_and_reads_only_exported_metrics() -> None:
    exported = exported_metrics()
    for name, rule in _rules().items():
        selectors = _selectors(rule["expr"])
        assert selectors, name
        for selector in selectors:
            assert selector.name in exported | PROMETHEUS_BUILTINS, (name, selector.name)


def test_label_values_are_ones_the_code_writes() -> None:
    """A renamed law reason or breaker state must be renamed in the alerts too."""
    allowed = {
        "reason": {r.value for r in LawReason},
        "state": {s.value for s in BreakerState},
    }
    for name, rule in _rules().items():
        for selector in _selectors(rule["expr"]):
            for matcher in selector.matchers.matchers:
                if matcher.name in allowed:
                    assert matcher.value in allowed[matcher.name], (name, matcher.name, matcher.value)


def test_scaler_down_reads_the_scaler_services_job_in_the_release_namespace() -> None:
    expr = _rules()["TidegateScalerDown"]["expr"]
    assert 'up{job="tg-tidegate-scaler", namespace="tidegate"}' in expr
    assert "absent(" in expr  # a scaler Prometheus does not scrape at all is down too


def test_values_reach_the_rules() -> None:
    rules = _rules(
        "--set", "alerts.capacityRejectRate=0.1", "--set", "alerts.for.breakerOpen=2m",
        "--set", "alerts.alertLabels.team=ml", "--set", "alerts.runbookUrl=https://wiki.example/tidegate",
        "--set", "alerts.labels.release=kube-prometheus-stack",
    )  # fmt: skip
    assert rules["TidegatePoolSaturatedAtMaxReplicas"]["expr"].rstrip().endswith("> 0.1")
    assert rules["TidegateCircuitBreakerOpen"]["for"] == "2m"
    for rule in rules.values():
        assert rule["labels"]["team"] == "ml" and rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["runbook_url"] == "https://wiki.example/tidegate#" + rule["annotations"]["runbook"]
    assert _rule_doc("--set", "alerts.labels.release=x")["metadata"]["labels"]["release"] == "x"


def _rule_file(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "tidegate.rules.yaml"
    path.write_text(yaml.safe_dump(_rule_doc()["spec"]))
    return path


def test_promtool_checks_the_rules(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(_rule_file(tmp_path))], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(NAMES)} rules found" in result.stdout


def _expand(text: str, labels: dict[str, str], value: str) -> str:
    """Prometheus' alert templating, for the two forms the chart uses: ``$labels.x`` and ``$value``."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)
    return text.replace("{{ $value }}", value)


SIDECAR = {"namespace": "ml", "pool": "chat", "pod": "chat-0"}
POOL = {"namespace": "ml", "pool": "chat"}


def _series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    body = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{body}}}", "values": values}


# Each case: input series at 1m steps; the alert is silent before its `for` and fires after it.
CASES = {
    "TidegateScalerDown": (
        [_series("up", {"job": "tg-tidegate-scaler", "namespace": "tidegate", "pod": "s-0"}, "1 1 0x20"),
         _series("up", {"job": "tg-tidegate-scaler", "namespace": "tidegate", "pod": "s-1"}, "1 0x21")],
        "4m", "9m", {}, "0",
    ),
    "TidegateScalerStatsStale": (
        [_series("tidegate_scaler_desired_replicas", {**POOL, "reason": "hold_stale"}, "3x20")],
        "8m", "12m", POOL, "3",
    ),
    "TidegatePoolSaturatedAtMaxReplicas": (
        [_series("tidegate_scaler_desired_replicas", {**POOL, "reason": "bounds"}, "8x20"),
         _series("tidegate_scaler_capacity_reject_rate", POOL, "0.3x20"),
         # held at its bounds without capacity rejections (e.g. lifted to minReplicas): no alert
         _series("tidegate_scaler_desired_replicas", {"namespace": "ml", "pool": "idle", "reason": "bounds"}, "2x20"),
         _series("tidegate_scaler_capacity_reject_rate", {"namespace": "ml", "pool": "idle"}, "0x20")],
        "10m", "16m", POOL, "8",
    ),
    "TidegateCircuitBreakerOpen": (
        [_series("tidegate_admission_breaker_state", {**SIDECAR, "state": "closed"}, "1 1 0x20"),
         _series("tidegate_admission_breaker_state", {**SIDECAR, "pod": "chat-1", "state": "closed"},
                 "1 0 1 0 1 0 1 0 1 0 1 0 1")],  # flapping, closing between failures: no alert
        "5m", "8m", SIDECAR, "0",
    ),
    "TidegateTelemetryUnreadable": (
        [_series("tidegate_admission_telemetry_up", SIDECAR, "1 1 0x20")],
        "8m", "13m", SIDECAR, "0",
    ),
    "TidegatePoolDegraded": (
        [_series("tidegate_pool_condition", {**POOL, "type": "Degraded", "status": "True"}, "0 0 1x20"),
         _series("tidegate_pool_condition", {**POOL, "type": "Degraded", "status": "False"}, "1 1 0x20"),
         # Degraded False, Ready False (still loading): no alert
         _series("tidegate_pool_condition", {"namespace": "ml", "pool": "new", "type": "Degraded", "status": "True"},
                 "0x20"),
         _series("tidegate_pool_condition", {"namespace": "ml", "pool": "new", "type": "Ready", "status": "False"},
                 "1x20"),
         # Degraded for a minute at a time (a transient refusal): no alert
         _series("tidegate_pool_condition", {"namespace": "ml", "pool": "blip", "type": "Degraded", "status": "True"},
                 "0 1 0 1 0 1 0 1 0 1 0 1 0 1 0")],
        "11m", "13m", POOL, "1",
    ),
}  # fmt: skip


@pytest.mark.parametrize("alert", sorted(CASES))
def test_alert_fires_on_its_state_after_its_for(tmp_path: pathlib.Path, alert: str) -> None:
    series, silent_at, firing_at, labels, value = CASES[alert]
    rule = _rules()[alert]
    expected = {
        "exp_labels": {**labels, **rule["labels"]},
        "exp_annotations": {k: _expand(v, labels, value) for k, v in rule["annotations"].items()},
    }
    tests = {
        "rule_files": [str(_rule_file(tmp_path))],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": silent_at, "alertname": alert, "exp_alerts": []},
                    {"eval_time": firing_at, "alertname": alert, "exp_alerts": [expected]},
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [promtool(), "test", "rules", str(tmp_path / "test.yaml")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_operators_gauge_is_served_and_scraped_for_the_degraded_alert() -> None:
    docs = render(*IMAGE, *PROMETHEUS_OPERATOR)
    operator = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator"))
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "TIDEGATE_METRICS_PORT", "value": "8082"} in container["env"]
    assert {"name": "metrics", "containerPort": 8082, "protocol": "TCP"} in container["ports"]
    monitors = [d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"].endswith("-operator")]
    assert len(monitors) == 1
    spec = monitors[0]["spec"]
    assert spec["selector"]["matchLabels"].items() <= operator["spec"]["template"]["metadata"]["labels"].items()
    [endpoint] = spec["podMetricsEndpoints"]
    # the series' own namespace (the pool's) must win over the operator pod's
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    off = render(*IMAGE, *PROMETHEUS_OPERATOR, "--set", "operator.metricsPort=0")
    assert not [d for d in off if d["kind"] == "PodMonitor" and d["metadata"]["name"].endswith("-operator")]
