"""The pool's conditions from what one reconcile observed (issue 14): Degraded names its cause."""

import pytest

from tidegate.operator import conditions, warm_pool
from tidegate.operator.conditions import Integration

pytestmark = pytest.mark.unit


def _observed(**kw) -> conditions.Observed:
    plan = warm_pool.plan([], desired_active=0, warm_size=0, now_s=0.0, drain_timeout_s=1.0)
    base = dict(
        generation=1, desired_active=0, warm_size=0, plan=plan, selector="s", keda=Integration.APPLIED,
        keda_message="k", node_pool=Integration.DISABLED, node_pool_message="n", scaler_reachable=None,
    )  # fmt: skip
    return conditions.Observed(**{**base, **kw})


def _degraded(observed: conditions.Observed) -> dict:
    return next(c for c in conditions.status(observed, [])["conditions"] if c["type"] == "Degraded")


def test_degraded_carries_the_first_problems_reason_and_every_message() -> None:
    degraded = _degraded(
        _observed(degraded_reasons=("pods forbidden", "image missing"), degraded_reason="PodCreateFailed")
    )
    assert degraded["status"] == "True"
    assert degraded["reason"] == "PodCreateFailed"
    assert degraded["message"] == "pods forbidden; image missing"


def test_no_problem_is_as_expected() -> None:
    degraded = _degraded(_observed())
    assert (degraded["status"], degraded["reason"], degraded["message"]) == ("False", "AsExpected", "no problem seen")


def test_ready_replicas_behind_a_refused_service_are_not_ready_and_say_why() -> None:
    # Replicas up, but the API server refused the pool's Service (a quota on services): no request
    # reaches them, so the pool is not Ready, and Ready's message quotes the refusal.
    refusal = "the API server refused Service llama (403 Forbidden): exceeded quota: no-services, limited: services=0"
    plan = warm_pool.plan(
        [warm_pool.PodView(name="p", role="active", ready=True, created_s=0.0)], 1, 0, now_s=0.0, drain_timeout_s=1.0
    )
    ready = next(
        c for c in conditions.status(_observed(desired_active=1, plan=plan), [])["conditions"] if c["type"] == "Ready"
    )
    assert (ready["status"], ready["reason"]) == ("True", "Serving")
    observed = _observed(desired_active=1, plan=plan, no_service=refusal)
    ready = next(c for c in conditions.status(observed, [])["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NoService")
    assert ready["message"] == f"1/1 active ready, 0/0 warm ready; no requests reach them: {refusal}"
