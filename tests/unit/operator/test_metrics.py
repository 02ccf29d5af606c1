"""The operator exports each pool's conditions as ``tidegate_pool_condition`` (issue 14 item 8):
what an alert on "Degraded for N minutes" reads, scraped as Prometheus would."""

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tidegate.operator.metrics import PoolConditions

pytestmark = pytest.mark.unit


def _scrape(metrics: PoolConditions) -> dict[tuple[str, str, str, str], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.labels["namespace"], s.labels["pool"], s.labels["type"], s.labels["status"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _conditions(**statuses: str) -> list[dict[str, str]]:
    return [{"type": t, "status": s, "reason": "R", "message": "m"} for t, s in statuses.items()]


def test_one_for_the_status_the_condition_has_now_and_zero_for_the_others() -> None:
    metrics = PoolConditions()
    metrics.observe("ml", "chat", _conditions(Ready="False", Degraded="True"))
    seen = _scrape(metrics)
    assert seen[("ml", "chat", "Degraded", "True")] == 1
    assert seen[("ml", "chat", "Degraded", "False")] == 0
    assert seen[("ml", "chat", "Degraded", "Unknown")] == 0
    assert seen[("ml", "chat", "Ready", "False")] == 1
    assert len(seen) == 6

    metrics.observe("ml", "chat", _conditions(Ready="True", Degraded="False"))
    seen = _scrape(metrics)
    assert seen[("ml", "chat", "Degraded", "True")] == 0
    assert seen[("ml", "chat", "Degraded", "False")] == 1


def test_a_condition_the_pool_no_longer_has_and_a_deleted_pool_leave_no_series() -> None:
    metrics = PoolConditions()
    metrics.observe("ml", "chat", _conditions(Degraded="True", ScalerReachable="False"))
    metrics.observe("ml", "other", _conditions(Degraded="False"))
    metrics.observe("ml", "chat", _conditions(Degraded="True"))  # KEDA turned off: no ScalerReachable
    assert not [k for k in _scrape(metrics) if k[2] == "ScalerReachable"]
    metrics.forget("ml", "chat")
    assert {k[1] for k in _scrape(metrics)} == {"other"}


def test_a_status_outside_true_false_is_unknown() -> None:
    metrics = PoolConditions()
    metrics.observe("ml", "chat", [{"type": "Degraded"}])
    assert _scrape(metrics)[("ml", "chat", "Degraded", "Unknown")] == 1
