"""A pool's condition changes become Events and log lines once per transition (issue 14).

Seen on the local cluster with the real KEDA v2.21.0: killing the scaler turned the pool
``ScalerReachable=False KedaHoldsReplicas`` and ``KedaReady=False NotReady`` with no Event and no
operator log line; only ``kubectl describe``'s conditions and the condition metric told.
"""

import logging
from typing import Any

import pytest

from tidegate.operator import reconcile
from tidegate.operator.conditions import changes
from tidegate.operator.failures import Problem

pytestmark = pytest.mark.unit


def _cond(ctype: str, status: str, reason: str, message: str = "m") -> dict[str, str]:
    return {"type": ctype, "status": status, "reason": reason, "message": message}


def _status(*conds: dict[str, str], ready_replicas: int = 3) -> dict[str, Any]:
    return {"readyReplicas": ready_replicas, "conditions": list(conds)}


HEALTHY = _status(
    _cond("Ready", "True", "Serving", "3/3 active ready"),
    _cond("Progressing", "False", "Converged"),
    _cond("Degraded", "False", "AsExpected", "no problem seen"),
    _cond("KedaReady", "True", "Applied"),
    _cond("NodePoolReady", "True", "Disabled"),
    _cond("ScalerReachable", "True", "HealthCheckServing"),
)
SCALER_DOWN = _status(
    _cond("Ready", "True", "Serving", "3/3 active ready"),
    _cond("Progressing", "False", "Converged"),
    _cond("Degraded", "False", "AsExpected", "no problem seen"),
    _cond("KedaReady", "False", "NotReady", "KEDA reports ScaledObject held not Ready: ScaledObjectCheckFailed"),
    _cond("NodePoolReady", "True", "Disabled"),
    _cond("ScalerReachable", "False", "KedaHoldsReplicas", "KEDA holds the pool at its current 3 replica(s)"),
)


def _said(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, bool]]:
    return [(c.text, c.bad) for c in changes(old, new)]


def test_the_scaler_going_away_is_said_once_and_its_return_once() -> None:
    assert _said(HEALTHY, SCALER_DOWN) == [
        ("KedaReady=False NotReady: KEDA reports ScaledObject held not Ready: ScaledObjectCheckFailed", True),
        ("ScalerReachable=False KedaHoldsReplicas: KEDA holds the pool at its current 3 replica(s)", True),
    ]
    assert _said(SCALER_DOWN, SCALER_DOWN) == []  # the next reconciles: nothing new
    assert [(c.type, c.status, c.bad) for c in changes(SCALER_DOWN, HEALTHY)] == [
        ("KedaReady", "True", False),
        ("ScalerReachable", "True", False),
    ]


def test_a_new_cause_of_the_same_bad_status_is_said_a_new_message_is_not() -> None:
    unreachable = _status(_cond("KedaReady", "False", "ScalerUnreachable"))
    not_ready = _status(_cond("KedaReady", "False", "NotReady", "KEDA's words"))
    assert _said(unreachable, not_ready) == [("KedaReady=False NotReady: KEDA's words", True)]
    held = _status(_cond("ScalerReachable", "False", "KedaHoldsReplicas", "holds 3"))
    assert _said(held, _status(_cond("ScalerReachable", "False", "KedaHoldsReplicas", "holds 4"))) == []


def test_a_new_pool_starting_up_is_quiet_until_it_serves() -> None:
    first = _status(
        _cond("Ready", "False", "WaitingForReplicas", "0/1 active ready"),
        _cond("Degraded", "False", "AsExpected"),
        _cond("KedaReady", "False", "NotReconciled"),
        _cond("NodePoolReady", "True", "Disabled"),
        _cond("ScalerReachable", "True", "HealthCheckServing"),
        ready_replicas=0,
    )
    assert _said(_status(), first) == []
    serving = _status(_cond("Ready", "True", "Serving", "1/1 active ready"), ready_replicas=1)
    assert _said(first, serving) == [("Ready=True Serving: 1/1 active ready", False)]


def test_a_new_pool_whose_integration_is_missing_says_so_at_once() -> None:
    first = _status(_cond("NodePoolReady", "False", "CRDMissing", "Karpenter is not installed"), ready_replicas=0)
    assert _said(_status(), first) == [("NodePoolReady=False CRDMissing: Karpenter is not installed", True)]


def test_ready_is_bad_only_when_nothing_serves() -> None:
    scaling_up = _status(_cond("Ready", "False", "WaitingForReplicas", "3/5 active ready"), ready_replicas=3)
    assert _said(HEALTHY, scaling_up) == []  # a scale-up in progress is routine
    nothing = _status(_cond("Ready", "False", "WaitingForReplicas", "0/5 active ready"), ready_replicas=0)
    assert _said(scaling_up, nothing) == [("Ready=False WaitingForReplicas: 0/5 active ready", True)]
    assert _said(nothing, scaling_up) == [("Ready=False WaitingForReplicas: 3/5 active ready", False)]


def test_degraded_is_said_by_its_problems_and_its_recovery_here() -> None:
    degraded = _status(
        _cond("Ready", "True", "Serving", "3/3 active ready"),
        _cond("Degraded", "True", "PodCreateFailed", "violates PodSecurity"),
    )
    assert _said(HEALTHY, degraded) == []  # each problem is its own Warning Event (reconcile._announce)
    assert _said(degraded, HEALTHY) == [("Degraded=False AsExpected: no problem seen", False)]


class _Kube:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []

    def event(self, _pool: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message, warning))


POOL = {"metadata": {"namespace": "ml", "name": "held"}}


def test_each_transition_is_one_event_and_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    kube = _Kube()
    caplog.set_level(logging.DEBUG, logger="tidegate.operator.reconcile")
    reconcile._announce(kube, POOL, [], HEALTHY, SCALER_DOWN)
    reconcile._announce(kube, POOL, [], SCALER_DOWN, SCALER_DOWN)  # a resync: nothing more
    reconcile._announce(kube, POOL, [], SCALER_DOWN, HEALTHY)
    assert [(r, w) for r, _, w in kube.events] == [
        ("NotReady", True),
        ("KedaHoldsReplicas", True),
        ("Applied", False),
        ("HealthCheckServing", False),
    ]
    assert kube.events[1][1] == "ScalerReachable=False: KEDA holds the pool at its current 3 replica(s)"
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert [level for level, _ in lines] == ["WARNING", "WARNING", "INFO", "INFO"]
    assert lines[1][1] == "ScalerReachable=False KedaHoldsReplicas: KEDA holds the pool at its current 3 replica(s)"


def test_a_problem_already_reported_is_not_repeated() -> None:
    kube = _Kube()
    problem = Problem("PodCreateFailed", "violates PodSecurity")
    degraded = _status(_cond("Degraded", "True", "PodCreateFailed", "violates PodSecurity"))
    reconcile._announce(kube, POOL, [problem], HEALTHY, degraded)
    reconcile._announce(kube, POOL, [problem], degraded, degraded)
    assert kube.events == [("PodCreateFailed", "violates PodSecurity", True)]


def test_a_pool_born_degraded_says_each_problem_once() -> None:
    # a new pool whose Deployment the API server refuses: its first status is already Degraded=True.
    # Its problem is one Warning Event and one WARNING line, not a second "Degraded=True ..." copy
    # (seen in the cluster tier: the refusal logged twice at WARNING).
    kube = _Kube()
    problem = Problem("ApiRefused", "the API server refused Deployment lc (422)")
    born = _status(_cond("Degraded", "True", "ApiRefused", problem.message))
    reconcile._announce(kube, POOL, [problem], {}, born)
    assert kube.events == [("ApiRefused", problem.message, True)]
