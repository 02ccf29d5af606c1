"""The scaler's decision as the pool's status (pure part)."""

from tidegate.operator import signal


def test_decision_becomes_status_signal_and_the_reject_rate_column() -> None:
    status = signal.to_status(
        {"current": 4, "desired": 6, "text": "4 -> 6: capacity reject 31% across 5 tenants",
         "capacityRejectRate": 0.31, "policyRejectRate": 0.0, "time": "2026-11-30T06:00:00+00:00"}
    )  # fmt: skip
    assert status["capacityRejectRate"] == 0.31
    assert status["signal"] == {
        "desiredReplicas": 6,
        "capacityRejectRate": 0.31,
        "policyRejectRate": 0.0,
        "reason": "4 -> 6: capacity reject 31% across 5 tenants",
        "time": "2026-11-30T06:00:00+00:00",
    }


def test_missing_rates_leave_the_fields_out_rather_than_write_nonsense() -> None:
    status = signal.to_status({"desired": 3, "text": "3 -> 3: holding: first sample", "capacityRejectRate": None})
    assert status["capacityRejectRate"] is None
    assert "capacityRejectRate" not in status["signal"] and status["signal"]["desiredReplicas"] == 3


def test_an_unreachable_scaler_is_no_signal_not_an_error() -> None:
    assert signal.fetch("http://127.0.0.1:9", "ns", "pool", timeout_s=0.2) is None
