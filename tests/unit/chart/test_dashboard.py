"""The Grafana dashboard: real PromQL over metrics tidegate exports, with the panels platform teams ask for."""

import json
import pathlib
import re

import promql_parser

from tidegate.admission.reasons import CAPACITY_REASONS, POLICY_REASONS
from tidegate.operator import chart_sync

CHART = pathlib.Path(__file__).resolve().parents[3] / "charts" / "tidegate"
DASHBOARD = json.loads((CHART / "files/dashboards/tidegate.json").read_text())


def _exprs() -> dict[str, list[str]]:
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in DASHBOARD["panels"]}


def _parse(expr: str):
    # Grafana substitutes its variables before Prometheus sees the query.
    return promql_parser.parse(expr.replace("$__rate_interval", "5m"))


def test_every_query_parses_and_reads_only_known_metrics() -> None:
    for title, exprs in _exprs().items():
        for expr in exprs:
            _parse(expr)
            names = set(re.findall(r"\b(tidegate_[a-z_]+|kube_[a-z_]+)\b", expr))
            assert names and names <= set(chart_sync.METRICS), (title, names)


def test_the_panels_the_issue_lists() -> None:
    titles = " | ".join(_exprs())
    for words in (
        "Capacity reject rate by tenant",
        "Policy reject rate by tenant",
        "KV cache usage by pod and node",
        "TTFT p95 / p99 by priority",
        "desired (scaler) vs active vs warm",
    ):
        assert words in titles


def test_reject_rates_split_capacity_from_policy_exactly() -> None:
    exprs = _exprs()
    capacity = exprs["Capacity reject rate by tenant (buys GPUs)"][0]
    policy = exprs["Policy reject rate by tenant (never buys GPUs)"][0]
    reasons = lambda e: set(re.search(r'reason=~"([^"]+)"', e).group(1).split("|"))  # noqa: E731
    assert reasons(capacity) == {r.value for r in CAPACITY_REASONS}
    assert reasons(policy) == {r.value for r in POLICY_REASONS}
    for expr in (capacity, policy):
        assert "sum by (tenant)" in expr


def test_ttft_quantiles_are_per_priority_class() -> None:
    p95, p99 = _exprs()["TTFT p95 / p99 by priority class"]
    assert p95.startswith("histogram_quantile(0.95,") and p99.startswith("histogram_quantile(0.99,")
    assert "by (le, priority)" in p95


def test_variables_filter_every_sidecar_query() -> None:
    assert [v["name"] for v in DASHBOARD["templating"]["list"]] == ["datasource", "namespace", "pool"]
    for exprs in _exprs().values():
        for expr in exprs:
            assert 'pool=~"$pool"' in expr


def test_every_metric_is_one_the_sidecar_or_the_scaler_defines() -> None:
    """A renamed metric in admission/metrics.py or scaler/metrics.py must be renamed in the dashboard too."""
    repo = CHART.parents[1]
    sources = (repo / "admission/metrics.py").read_text() + (repo / "scaler/metrics.py").read_text()
    for name in chart_sync.METRICS:
        family = re.sub(r"_(total|bucket)$", "", name)
        assert f'"{family}"' in sources, f"{name}: not defined by the sidecar or the scaler"
