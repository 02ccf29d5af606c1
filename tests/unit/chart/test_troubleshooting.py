"""docs/troubleshooting.md names only what the code has: metrics, conditions and their reasons,
admission reasons, and the chart's alerts, each of which links to a section that exists."""

import pathlib
import re

import pytest

from tests.unit.chart.helm import IMAGE, PROMETHEUS_OPERATOR, exported_metrics, render
from tidegate.admission import errors
from tidegate.admission.breaker import BreakerState
from tidegate.admission.reasons import Reason
from tidegate.admission.telemetry import ErrorKind
from tidegate.api.status import ConditionType
from tidegate.operator import failures
from tidegate.operator.conditions import Integration
from tidegate.scaler.law import Reason as LawReason

REPO = pathlib.Path(__file__).resolve().parents[3]
DOC = (REPO / "docs/troubleshooting.md").read_text()
# Kubernetes' own reasons, which the operator's Warning Events repeat: the kubelet's on a container that
# cannot pull its image, the ReplicaSet controller's when it cannot create pods, the scheduler's
KUBERNETES_REASONS = {"FailedCreate", "Unschedulable", "FailedScheduling"} | failures.STUCK_WAITING
# KEDA v2.21.0's reason on a ScaledObject whose scaler it cannot query (quoted in KedaReady's message)
KEDA_REASONS = {"ScaledObjectCheckFailed"}
DEGRADED_REASONS = {v for k, v in vars(failures.Reason).items() if k.isupper()}


def _condition_reasons() -> set[str]:
    """Reasons the operator writes into conditions (and Event reasons): the Integration states and the
    CamelCase literals of the modules that build conditions and post Events."""
    literals = set()
    for module in ("operator/conditions.py", "operator/handlers.py", "operator/reconcile.py"):
        literals |= set(re.findall(r'(?<=")[A-Z][a-z]+(?:[A-Z][a-z]*)*(?=")', (REPO / module).read_text()))
    return literals | {i.value for i in Integration} | DEGRADED_REASONS


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


ANCHORS = {_slug(h) for h in re.findall(r"^#+ (.+)$", DOC, flags=re.MULTILINE)}


def test_starts_from_the_symptoms_the_issue_lists() -> None:
    for symptom in ("ACTIVE stays empty", "Everything gets 503", "The pool never scales", "429 for one tenant"):
        assert f"\n## {symptom}\n" in DOC
    assert "\n## Telemetry unreadable\n" in DOC


def test_every_metric_named_is_exported() -> None:
    named = set(re.findall(r"\btidegate_[a-z_]+\b", DOC))
    assert named and named <= exported_metrics(), sorted(named - exported_metrics())


def test_every_condition_named_is_one_the_operator_sets() -> None:
    named = set(re.findall(r"`([A-Z][A-Za-z]+)=(?:True|False|Unknown)`", DOC))
    assert {"Ready", "Degraded", "KedaReady", "ScalerReachable", "NodePoolReady"} <= named
    assert named <= {t.value for t in ConditionType}, named


def test_every_condition_reason_named_is_one_the_operator_writes() -> None:
    after_reason = set(re.findall(r"reason\s+`([A-Za-z]+)`", DOC))
    assert {"WaitingForReplicas", "InvalidSpec", "CRDMissing", "HealthCheckFailed", "Scaled"} <= after_reason
    # every backquoted CamelCase word but the alerts' names (held to the chart below)
    named = {w for w in re.findall(r"`([A-Z][A-Za-z]+)`", DOC) if not w.startswith("Tidegate")}
    known = _condition_reasons() | {t.value for t in ConditionType} | KUBERNETES_REASONS | KEDA_REASONS
    assert named <= known, sorted(named - known)


def test_every_degraded_reason_is_explained() -> None:
    section = DOC.split("\n## ")[1]  # ACTIVE stays empty
    rows = set(re.findall(r"^  \| `([A-Za-z]+)` \|", section, flags=re.MULTILINE))
    assert rows == DEGRADED_REASONS, sorted(rows ^ DEGRADED_REASONS)


def test_every_code_named_is_a_real_reason_or_label_value() -> None:
    """Backquoted snake_case words are admission reasons, error codes, law reasons or label values."""
    known = (
        {r.value for r in Reason}
        | {r.value for r in LawReason}
        | {k.value for k in ErrorKind}
        | {s.value for s in BreakerState}
        | {errors.BODY_READ_TIMEOUT, errors.PATH_NOT_ADMITTED, "upstream_error", "upstream_timeout"}
    )
    named = set(re.findall(r"`([a-z]+(?:_[a-z]+)+)`", DOC)) | set(re.findall(r'reason=~?"([a-z_|]+)"', DOC))
    named = {word for words in named for word in words.split("|") if not word.startswith("tidegate_")}
    assert named <= known, sorted(named - known)
    words = set(re.findall(r"`([a-z_]+)`", DOC))
    assert {r.value for r in Reason} - words == set(), "every admission reason has its place in the doc"


def test_internal_links_point_at_sections() -> None:
    for anchor in re.findall(r"\]\(#([a-z0-9_-]+)\)", DOC):
        assert anchor in ANCHORS, anchor


@pytest.fixture(scope="module")
def alerts() -> dict[str, dict]:
    docs = render(*IMAGE, *PROMETHEUS_OPERATOR, "--set", "alerts.enabled=true")
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_every_alert_links_to_a_section_that_names_it(alerts: dict[str, dict]) -> None:
    for name, rule in alerts.items():
        anchor = rule["annotations"]["runbook"]
        assert anchor in ANCHORS, (name, anchor)
        sections = {_slug(s.splitlines()[0]): s for s in DOC.split("\n## ")}
        assert name in sections[anchor], f"{name}: section #{anchor} does not name it"
    assert set(re.findall(r"\bTidegate[A-Z][A-Za-z]+\b", DOC)) <= set(alerts)
