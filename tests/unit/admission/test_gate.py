"""System gate: hysteresis, staleness and frozen gauges."""

from tidegate.admission.gate import GateSignal
from tidegate.api.admission import KvCacheGate, StalePolicy

SPEC = KvCacheGate()  # trip 0.92, resume 0.85


def blocking(signal: GateSignal, now: float, **kw: object) -> bool:
    args = {"stale_after_s": 10.0, "on_stale": StalePolicy.FAIL_OPEN}
    args.update(kw)
    return signal.blocking(now, SPEC, **args)  # type: ignore[arg-type]


def test_trips_at_trip_and_resumes_only_below_resume() -> None:
    s = GateSignal()
    readings = [0.5, 0.91, 0.92, 0.90, 0.86, 0.85, 0.84, 0.91]
    seen = []
    for t, value in enumerate(readings):
        s.observe(value, float(t), SPEC)
        seen.append(blocking(s, float(t)))
    assert seen == [False, False, True, True, True, True, False, False]


def test_a_signal_never_read_is_not_pressure() -> None:
    assert not blocking(GateSignal(), 100.0)


def test_stale_telemetry_follows_the_configured_policy() -> None:
    s = GateSignal()
    s.observe(0.99, 0.0, SPEC)
    assert blocking(s, 10.0)
    assert not blocking(s, 10.1, on_stale=StalePolicy.FAIL_OPEN)
    assert blocking(s, 10.1, on_stale=StalePolicy.FAIL_CLOSED)
    s2 = GateSignal()
    s2.observe(0.1, 0.0, SPEC)
    assert blocking(s2, 11.0, on_stale=StalePolicy.FAIL_CLOSED)


def test_a_frozen_gauge_with_nothing_in_flight_is_not_pressure() -> None:
    s = GateSignal()
    for t in range(5):  # polled every second, always the same 99%
        s.observe(0.99, float(t), SPEC)
    assert blocking(s, 4.0, idle=False, frozen_after_s=2.0)  # requests in flight: trust it
    assert not blocking(s, 4.0, idle=True, frozen_after_s=2.0)
    s.observe(0.97, 5.0, SPEC)  # it moves again: real pressure
    assert blocking(s, 5.0, idle=True, frozen_after_s=2.0)


def test_disabled_gate_never_blocks() -> None:
    s = GateSignal()
    s.observe(1.0, 0.0, SPEC)
    assert not s.blocking(0.0, KvCacheGate(enabled=False), stale_after_s=10, on_stale=StalePolicy.FAIL_CLOSED)
