"""Circuit breaker: trips on degradation only, cools down with doubling, probes never lock out."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.admission.breaker import Breaker, BreakerState, BreakerTuning, Completion
from tidegate.api.admission import CircuitBreakerSpec

from .helpers import FakeClock


def breaker(clock: FakeClock, **spec: object) -> Breaker:
    return Breaker(CircuitBreakerSpec.model_validate({"minSamples": 4, **spec}), BreakerTuning(stall_s=5.0), clock)


def trip(b: Breaker) -> None:
    for _ in range(5):
        b.record(Completion.FAILURE)


def probe_all(b: Breaker, outcome: Completion) -> int:
    """Offer arrivals until the half-open sample is taken; every probe ends with ``outcome``."""
    probes = []
    for _ in range(20):
        allowed, epoch = b.allow()
        if allowed:
            probes.append(epoch)
    for epoch in probes:
        b.record(outcome, 0.01, epoch)
    return len(probes)


def test_a_burst_of_failures_opens_and_refuses_until_the_cooldown_ends() -> None:
    clock = FakeClock()
    b = breaker(clock)
    trip(b)
    assert b.state is BreakerState.OPEN
    assert b.allow() == (False, None)
    assert b.retry_after_s() == pytest.approx(60.0)
    clock.advance(59.9)
    assert b.state is BreakerState.OPEN
    clock.advance(0.1)
    assert b.state is BreakerState.HALF_OPEN


def test_upstream_429_and_cancellations_never_trip() -> None:
    b = breaker(FakeClock())
    for _ in range(50):
        b.record(Completion.NEUTRAL)
        b.record(Completion.CANCELLED)
    assert b.state is BreakerState.CLOSED


def test_error_ratio_over_the_window_trips() -> None:
    b = breaker(FakeClock(), errorRatio=0.5)
    for _ in range(4):  # ok, fail alternating: never 5 in a row, never over half
        b.record(Completion.SUCCESS, 0.01)
        b.record(Completion.FAILURE)
    assert b.state is BreakerState.CLOSED  # 50% is not over 50%
    b.record(Completion.FAILURE)
    assert b.state is BreakerState.OPEN


def test_half_open_lets_every_other_arrival_through_and_closes_on_success() -> None:
    clock = FakeClock()
    b = breaker(clock)
    trip(b)
    clock.advance(60)
    decisions = [b.allow()[0] for _ in range(10)]
    assert decisions == [True, False] * 5
    assert b.allow()[0] is False  # sample taken, outcomes pending
    epoch = b.epoch
    for _ in range(5):
        b.record(Completion.SUCCESS, 0.01, epoch)
    assert b.state is BreakerState.CLOSED


def test_failed_probes_reopen_with_doubling_cooldown_capped() -> None:
    clock = FakeClock()
    b = breaker(clock)
    trip(b)
    cooldowns = []
    for _ in range(4):
        cooldowns.append(b.retry_after_s())
        clock.advance(b.retry_after_s())
        probe_all(b, Completion.FAILURE)
        assert b.state is BreakerState.OPEN
    assert cooldowns == [60.0, 120.0, 240.0, 300.0]
    clock.advance(300)
    probe_all(b, Completion.SUCCESS)
    assert b.state is BreakerState.CLOSED
    trip(b)
    assert b.retry_after_s() == 60.0  # a close resets the doubling


@pytest.mark.parametrize("outcome", [Completion.NEUTRAL, Completion.CANCELLED])
def test_probes_without_a_verdict_free_their_slot(outcome: Completion) -> None:
    clock = FakeClock()
    b = breaker(clock)
    trip(b)
    clock.advance(60)
    for _ in range(3):  # whole samples end neutral: more probes keep being let through
        assert probe_all(b, outcome) == 5
    assert b.state is BreakerState.HALF_OPEN
    probe_all(b, Completion.SUCCESS)
    assert b.state is BreakerState.CLOSED


def test_outcomes_of_an_earlier_half_open_period_are_not_probes() -> None:
    clock = FakeClock()
    b = breaker(clock)
    trip(b)
    clock.advance(60)
    _, old_epoch = b.allow()
    probe_all(b, Completion.FAILURE)  # reopens: new epoch
    clock.advance(120)
    for _ in range(5):
        b.record(Completion.SUCCESS, 0.01, old_epoch)
    assert b.state is BreakerState.HALF_OPEN


def test_latency_over_the_calibrated_baseline_trips() -> None:
    b = breaker(FakeClock(), latencyMultiplier=3.0)
    for _ in range(20):
        b.record(Completion.SUCCESS, 0.5)
    assert b.baseline_ttft_s == pytest.approx(0.5)
    for _ in range(3):
        b.record(Completion.SUCCESS, 1.4)
    assert b.state is BreakerState.CLOSED
    for _ in range(10):
        b.record(Completion.SUCCESS, 5.0)
    assert b.state is BreakerState.OPEN
    assert "TTFT" in b.last_trip_reason


def test_a_replica_slowed_by_load_but_meeting_every_slo_is_not_cut_off() -> None:
    """TTFT grows with the sequences a replica runs: 9x its idle baseline is still within the
    interactive class's 2 s SLO, so it is load (the adaptive budget's business), not a fault that
    refuses everyone for a cooldown. Over the tightest SLO as well, the breaker opens."""
    from tidegate.admission.cost import RequestCost
    from tidegate.admission.reasons import Outcome

    from .helpers import engine

    clock = FakeClock()
    e = engine(clock, tokenBudget=100_000, maxConcurrency=64, circuitBreaker={"minSamples": 4})

    def serve(ttft_s: float) -> None:
        ticket = e.submit("t", "interactive", RequestCost.fixed(10, 10))
        if ticket.outcome is not Outcome.REJECT:  # once open, refused: nothing to release
            e.release(ticket, Completion.SUCCESS, ttft_s=ttft_s)

    for _ in range(20):
        serve(0.1)
    for _ in range(40):
        serve(0.9)
    assert e.breaker_state is BreakerState.CLOSED
    for _ in range(40):
        serve(2.5)
    assert e.breaker_state is BreakerState.OPEN and "TTFT" in e.breaker.last_trip_reason


def test_jitter_on_a_microsecond_baseline_does_not_trip() -> None:
    b = breaker(FakeClock())
    for _ in range(20):
        b.record(Completion.SUCCESS, 0.0001)
    for _ in range(20):
        b.record(Completion.SUCCESS, 0.05)  # 500x the baseline, still under 3 x the 0.25 s floor
    assert b.state is BreakerState.CLOSED


def test_non_streamed_responses_never_trip_or_calibrate_the_latency_trip() -> None:
    """The documented choice: a non-streamed answer has no TTFT (``ttft_s=None``), however slow it
    was end to end; only streamed TTFTs calibrate and trip on latency."""
    clock = FakeClock()
    b = breaker(clock)
    for _ in range(50):
        clock.advance(1.0)
        b.record(Completion.SUCCESS, None)
    assert b.baseline_ttft_s is None and b.state is BreakerState.CLOSED
    for _ in range(4):
        b.record(Completion.SUCCESS, 0.1)  # streamed: calibrates
    assert b.baseline_ttft_s == pytest.approx(0.1)
    for _ in range(20):
        b.record(Completion.SUCCESS, None)  # slow non-streamed answers in between change nothing
    assert b.state is BreakerState.CLOSED
    for _ in range(10):
        b.record(Completion.SUCCESS, 2.0)  # streamed and 8x the floor-bounded limit: trips
    assert b.state is BreakerState.OPEN and "TTFT" in b.last_trip_reason


def test_no_token_progress_with_requests_in_flight_trips() -> None:
    clock = FakeClock()
    b = breaker(clock)
    b.check_stall(in_flight=0, progress_ref_s=0.0)
    assert b.state is BreakerState.CLOSED  # idle is not a stall
    last_progress = clock.now
    clock.advance(4.9)
    b.check_stall(in_flight=3, progress_ref_s=last_progress)
    assert b.state is BreakerState.CLOSED
    clock.advance(0.1)
    b.check_stall(in_flight=3, progress_ref_s=last_progress)
    assert b.state is BreakerState.OPEN
    assert "progress" in b.last_trip_reason


def test_the_stall_window_is_at_most_half_the_request_timeout() -> None:
    clock = FakeClock()
    b = breaker(clock)  # stall_s 5
    last_progress = clock.now
    clock.advance(2.0)
    b.check_stall(in_flight=1, progress_ref_s=last_progress, request_timeout_s=600.0)
    assert b.state is BreakerState.CLOSED  # a long timeout: the 5 s window holds
    b.check_stall(in_flight=1, progress_ref_s=last_progress, request_timeout_s=4.0)
    assert b.state is BreakerState.OPEN  # a 4 s timeout: 2 s without progress is a stall
    assert b.last_trip_reason.startswith("no token progress for 2 s")


def test_a_disabled_breaker_lets_everything_through() -> None:
    b = breaker(FakeClock(), enabled=False)
    trip(b)
    assert b.allow() == (True, None)


# ---- tenant attribution: one client cannot trip the breaker for the others ----------------------


def test_one_tenants_failures_never_trip_while_another_tenant_succeeds() -> None:
    clock = FakeClock()
    b = breaker(clock)
    b.record(Completion.SUCCESS, None, tenant="good")
    for _ in range(50):  # far past 5 in a row and the error ratio
        clock.advance(0.1)
        b.record(Completion.FAILURE, tenant="bad")
    assert b.state is BreakerState.CLOSED
    assert b.allow() == (True, None)


def test_a_transient_failure_of_another_tenant_does_not_tip_one_tenants_flood_over() -> None:
    b = breaker(FakeClock())
    for _ in range(30):
        b.record(Completion.SUCCESS, None, tenant="good")
    for _ in range(40):
        b.record(Completion.FAILURE, tenant="bad")
    b.record(Completion.FAILURE, tenant="good")
    assert b.state is BreakerState.CLOSED


def test_a_replica_failing_every_tenant_still_trips() -> None:
    b = breaker(FakeClock())
    for tenant in ("a", "b", "c"):
        b.record(Completion.SUCCESS, None, tenant=tenant)
    failures = 0
    while b.state is BreakerState.CLOSED:
        b.record(Completion.FAILURE, tenant="abc"[failures % 3])
        failures += 1
    assert failures <= 8  # on the failures of the tenants other than the one failing most
    assert "from 2 tenants, not counting" in b.last_trip_reason


def test_a_lone_tenant_failing_with_nobody_else_succeeding_trips_as_before() -> None:
    b = breaker(FakeClock())
    for _ in range(5):
        b.record(Completion.FAILURE, tenant="only")
    assert b.state is BreakerState.OPEN


def test_once_the_other_tenants_success_leaves_the_window_failures_count() -> None:
    clock = FakeClock()
    b = breaker(clock)  # window 30 s
    b.record(Completion.SUCCESS, None, tenant="good")
    for _ in range(5):
        b.record(Completion.FAILURE, tenant="bad")
    assert b.state is BreakerState.CLOSED
    clock.advance(31)
    b.record(Completion.FAILURE, tenant="bad")
    assert b.state is BreakerState.OPEN


def test_half_open_one_tenants_failing_probes_do_not_reopen_while_another_tenants_succeed() -> None:
    clock = FakeClock()
    b = breaker(clock)
    trip(b)
    clock.advance(60)
    probes = [b.allow()[1] for _ in range(10)]
    epochs = [p for p in probes if p is not None]
    b.record(Completion.SUCCESS, 0.01, epochs[0], tenant="good")
    for epoch in epochs[1:]:
        b.record(Completion.FAILURE, None, epoch, tenant="bad")
    assert b.state is BreakerState.HALF_OPEN  # the bad tenant's probes freed their slots
    for epoch in [p for p in (b.allow()[1] for _ in range(20)) if p is not None]:
        b.record(Completion.SUCCESS, 0.01, epoch, tenant="good")
    assert b.state is BreakerState.CLOSED


def test_every_transition_is_reported_with_its_reason() -> None:
    clock = FakeClock()
    seen: list[tuple[BreakerState, BreakerState, str]] = []
    b = Breaker(
        CircuitBreakerSpec.model_validate({"minSamples": 20}), BreakerTuning(), clock, lambda *t: seen.append(t)
    )
    trip(b)
    clock.advance(60)
    probe_all(b, Completion.SUCCESS)
    assert [(old, new) for old, new, _ in seen] == [
        (BreakerState.CLOSED, BreakerState.OPEN),
        (BreakerState.OPEN, BreakerState.HALF_OPEN),
        (BreakerState.HALF_OPEN, BreakerState.CLOSED),
    ]
    assert seen[0][2].startswith("5 upstream failures in a row") and "open for 60 s" in seen[0][2]
    assert "cooldown over" in seen[1][2] and "5/5 half-open probes succeeded" in seen[2][2]


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.sampled_from(["good", "bad", "bad2"]), st.floats(0.0, 2.0)), max_size=200),
    min_samples=st.integers(1, 30),
    ratio=st.sampled_from([0.1, 0.5, 0.9]),
)
def test_failures_of_any_one_tenant_never_trip_while_another_succeeds_within_the_window(
    steps: list[tuple[str, float]], min_samples: int, ratio: float
) -> None:
    """The module's rule: "bad" and "bad2" fail every request, "good" succeeds every one; the
    breaker may open only when the window (10 s) holds failures of two tenants, or no success."""
    clock = FakeClock()
    b = breaker(clock, minSamples=min_samples, errorRatio=ratio, windowSeconds=10)
    b.record(Completion.SUCCESS, None, tenant="good")
    seen = [(clock.now, "good")]
    for tenant, dt in steps:
        clock.advance(dt)
        b.record(Completion.SUCCESS if tenant == "good" else Completion.FAILURE, None, tenant=tenant)
        seen.append((clock.now, tenant))
        if b.state is not BreakerState.CLOSED:
            window = {t for at, t in seen if at >= clock.now - 10}
            assert len(window - {"good"}) > 1 or "good" not in window
            return
