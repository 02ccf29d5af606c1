"""The operator's log lines: a time, a level and the pool; kopf's routine out of sight (issue 14 item 5)."""

import logging

import pytest

from tidegate.operator import logs

pytestmark = pytest.mark.unit


def _record(name: str, level: int, msg: str) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, None, None)


def test_kopfs_routine_success_lines_are_debug_and_failures_stay() -> None:
    quiet, verbose = logs.Routine(verbose=False), logs.Routine(verbose=True)
    routine = _record("kopf.objects", logging.INFO, "Handler 'pod_event' succeeded.")
    assert not quiet.filter(routine)
    assert verbose.filter(routine) and routine.levelname == "DEBUG"
    assert not quiet.filter(_record("kopf.objects", logging.INFO, "Creation is processed: 1 succeeded; 0 failed."))
    assert quiet.filter(_record("kopf.objects", logging.ERROR, "Handler 'pool_changed' failed temporarily: x"))
    assert quiet.filter(_record("tidegate.operator", logging.INFO, "promoted 1 warm replica(s): 1 -> 2 active"))


def test_plain_lines_carry_a_utc_time_a_level_and_the_pool() -> None:
    record = _record("tidegate.operator.reconcile", logging.WARNING, "degraded: x")
    record.k8s_ref = {"namespace": "ml", "name": "chat"}
    line = logs.PlainFormatter().format(record)
    assert line.endswith(" WARNING tidegate.operator.reconcile [ml/chat] degraded: x")
    assert line[10] == "T" and line[23] == "Z"
