"""The admission engine's decisions, as a client of the sidecar would see them."""

import pytest

from tidegate.admission.breaker import BreakerState, Completion
from tidegate.admission.cost import RequestCost
from tidegate.admission.engine import EngineTuning, Telemetry
from tidegate.admission.reasons import Outcome, Reason
from tidegate.admission.ticket import TicketState, TicketStateError

from .helpers import FakeClock, admission, engine, tokens

ONE_CLASS = {"priorityClasses": [{"name": "std", "ttftSloMs": 60_000}], "defaultPriorityClass": "std"}
SEPARATE = {"unlistedTenants": "separate"}  # each unlisted name its own tenant: tests of several tenants


def test_admits_within_budget_and_queues_beyond() -> None:
    e = engine(**ONE_CLASS)
    first = [e.submit("a", None, tokens(300)) for _ in range(3)]
    assert [t.state for t in first] == [TicketState.ADMITTED] * 3
    assert e.in_flight_tokens == 900
    waiting = e.submit("a", None, tokens(300))
    assert waiting.state is TicketState.QUEUED
    e.release(first[0], Completion.SUCCESS)
    assert waiting.state is TicketState.ADMITTED
    assert e.take_settled() == [waiting]


def test_release_twice_is_an_error() -> None:
    e = engine()
    t = e.submit("a", None, tokens(10))
    e.release(t, Completion.SUCCESS)
    with pytest.raises(TicketStateError):
        e.release(t, Completion.SUCCESS)
    assert e.in_flight_tokens == 0 and e.in_flight_requests == 0


def test_a_client_gone_while_queued_is_never_dispatched() -> None:
    e = engine(**ONE_CLASS)
    running = e.submit("a", None, tokens(1000))
    gone = e.submit("b", None, tokens(500))
    assert gone.state is TicketState.QUEUED
    assert e.cancel(gone)
    assert not e.cancel(gone)  # idempotent
    e.release(running, Completion.SUCCESS)
    assert gone.state is TicketState.CANCELLED
    assert e.in_flight_requests == 0 and e.queue.depth == 0
    assert e.tenants.state("b", 0).accepted == 0


def test_queue_timeout_refuses_with_a_retry_time() -> None:
    clock = FakeClock()
    e = engine(clock, queue={"maxWaitMs": 5000}, **ONE_CLASS)
    e.submit("a", None, tokens(1000))
    queued = e.submit("b", None, tokens(100))
    clock.advance(4.9)
    assert e.expire() == []
    clock.advance(0.1)
    assert e.expire() == [queued]
    assert queued.reason is Reason.QUEUE_TIMEOUT and queued.retry_after_s > 0


def test_a_request_that_cannot_start_before_its_deadline_is_refused_at_once() -> None:
    clock = FakeClock()
    e = engine(clock, tuning=EngineTuning(prior_duration_s=10.0))  # interactive SLO 2 s
    running = e.submit("a", None, tokens(800))
    assert running.state is TicketState.ADMITTED
    late = e.submit("b", None, tokens(800))
    # 600 of the 800 in-flight tokens must free: 600/800 of half the 10 s mean duration = 3.75 s > 2 s
    assert late.state is TicketState.REJECTED and late.reason is Reason.SLO_UNREACHABLE
    assert late.retry_after_s == pytest.approx(3.75)
    assert clock.now == late.submitted_at_s  # refused now, not after waiting


TIGHT = {"priorityClasses": [{"name": "interactive", "ttftSloMs": 1500}], "defaultPriorityClass": "interactive"}


def _learn_backend_ttft(e, clock: FakeClock, ttft_s: float, n: int = 10) -> None:
    """``n`` requests that each showed their first token ``ttft_s`` after the sidecar forwarded them."""
    for _ in range(n):
        t = e.submit("warmup", None, tokens(100))
        clock.advance(ttft_s)
        e.release(t, Completion.SUCCESS, ttft_s=ttft_s)


def test_a_queued_request_leaves_the_queue_once_its_ttft_can_no_longer_meet_the_slo() -> None:
    """The SLO is on the TTFT the client sees: queue wait + the backend's own TTFT. A request still
    queued when the learned backend TTFT (0.5 s here) no longer fits in what is left of its 1.5 s SLO
    is refused then, not admitted at 1.4 s to see its first token at ~1.9 s (the demo's spike ✗)."""
    clock = FakeClock()
    e = engine(clock, tuning=EngineTuning(prior_duration_s=0.5), maxConcurrency=1, **TIGHT)
    _learn_backend_ttft(e, clock, 0.5)
    running = e.submit("a", None, tokens(100))
    queued = e.submit("b", None, tokens(100))
    assert queued.state is TicketState.QUEUED  # predicted start 0.25 s + 0.5 s backend TTFT: within 1.5 s
    clock.advance(0.8)
    assert e.expire() == []
    clock.advance(0.2)  # 1.0 s queued: its first token could not come before ~1.5 s
    assert e.expire() == [queued]
    assert queued.reason is Reason.QUEUE_TIMEOUT and queued.retry_after_s > 0
    clock.advance(0.4)
    e.release(running, Completion.SUCCESS, ttft_s=0.5)
    assert queued.state is TicketState.REJECTED  # never admitted past its SLO


def test_a_request_whose_start_plus_backend_ttft_misses_the_slo_is_refused_at_once() -> None:
    clock = FakeClock()
    e = engine(clock, tuning=EngineTuning(prior_duration_s=0.5), maxConcurrency=1, **TIGHT)
    _learn_backend_ttft(e, clock, 0.5)
    e.submit("a", None, tokens(100))
    assert [e.submit(t, None, tokens(100)).state for t in "bc"] == [TicketState.QUEUED] * 2
    late = e.submit("d", None, tokens(100))
    # predicted start 1.25 s (half of a's 0.5 s, then b and c whole): within 1.5 s, but its first
    # token would come ~0.5 s later
    assert late.state is TicketState.REJECTED and late.reason is Reason.SLO_UNREACHABLE
    assert late.state is TicketState.REJECTED and late.reason is Reason.SLO_UNREACHABLE
    assert clock.now == late.submitted_at_s


def test_without_a_measured_backend_ttft_the_whole_slo_is_the_queue_deadline() -> None:
    clock = FakeClock()
    e = engine(clock, tuning=EngineTuning(prior_duration_s=0.5), maxConcurrency=1, **TIGHT)
    e.submit("a", None, tokens(100))
    queued = e.submit("b", None, tokens(100))
    clock.advance(1.4)
    assert e.expire() == [] and queued.state is TicketState.QUEUED
    clock.advance(0.1)
    assert e.expire() == [queued]


def test_measured_durations_shorten_predicted_waits() -> None:
    clock = FakeClock()
    e = engine(clock, tuning=EngineTuning(prior_duration_s=10.0, duration_alpha=1.0))
    first = e.submit("a", None, tokens(800))
    clock.advance(1.0)
    e.release(first, Completion.SUCCESS)
    assert e.mean_duration_s == pytest.approx(1.0)
    e.submit("a", None, tokens(800))
    assert e.submit("b", None, tokens(800)).state is TicketState.QUEUED


def test_interactive_reserve_is_kept_from_batch() -> None:
    e = engine()  # interactive reserves 30% of 1000 tokens and of 4 slots (floor 1.2 = 1)
    assert e.submit("a", "batch", tokens(800)).reason is Reason.REQUEST_TOO_LARGE  # never fits 700
    assert e.submit("a", "batch", tokens(700)).state is TicketState.ADMITTED
    assert e.submit("b", "batch", tokens(100)).state is TicketState.QUEUED
    assert e.submit("c", "interactive", tokens(300)).state is TicketState.ADMITTED


def test_batch_never_takes_the_interactive_share_even_while_interactive_uses_more_than_it() -> None:
    # Simulator, spike: interactive traffic past its 20 % let batch fill the rest, and the burst's
    # next interactive requests found the replica full of batch work (refused slo_unreachable).
    e = engine(tenancy=SEPARATE)  # interactive keeps 30% of 1000 tokens
    assert e.submit("a", "interactive", tokens(500)).state is TicketState.ADMITTED
    assert e.submit("b", "batch", tokens(200)).state is TicketState.ADMITTED  # 700: up to the share
    assert e.submit("b", "batch", tokens(100)).state is TicketState.QUEUED  # would take the last 30%
    assert e.submit("c", "interactive", tokens(300)).state is TicketState.ADMITTED  # its room is there


def test_the_interactive_share_stays_free_however_long_interactive_traffic_is_away() -> None:
    # lending the share to batch while interactive was away (tried) had the first interactive
    # request back find the replica full of long batch work and refused slo_unreachable
    clock = FakeClock()
    e = engine(clock, tenancy=SEPARATE)
    clock.advance(600)
    e.tick()
    assert e.submit("a", "batch", tokens(700)).state is TicketState.ADMITTED
    assert e.submit("b", "batch", tokens(100)).state is TicketState.QUEUED
    assert e.submit("c", "interactive", tokens(300)).state is TicketState.ADMITTED


def test_a_higher_class_displaces_the_lowest_queued_request_when_full() -> None:
    e = engine(queue={"maxDepth": 2}, tenancy=SEPARATE)
    e.submit("a", "batch", tokens(700))
    e.submit("a", "interactive", tokens(300))
    b1 = e.submit("b", "batch", tokens(100))
    b2 = e.submit("b", "batch", tokens(100))
    assert (b1.state, b2.state) == (TicketState.QUEUED, TicketState.QUEUED)
    vip = e.submit("c", "interactive", tokens(100))
    assert vip.state is TicketState.QUEUED
    assert b2.state is TicketState.REJECTED and b2.reason is Reason.QUEUE_FULL and b2.retry_after_s > 0
    assert b2 in e.take_settled()
    assert e.submit("d", "batch", tokens(100)).reason is Reason.QUEUE_FULL  # equal class: no displacement
    assert e.tenants.state("b", 0).accepted == 1  # the displaced one gave its slot back


def test_queueing_disabled_refuses_with_what_is_short() -> None:
    e = engine(queue={"maxDepth": 0}, **ONE_CLASS)
    for _ in range(4):
        e.submit("a", None, tokens(10))
    assert e.submit("a", None, tokens(10)).reason is Reason.CONCURRENCY
    e2 = engine(queue={"maxDepth": 0}, **ONE_CLASS)
    e2.submit("a", None, tokens(990))
    assert e2.submit("a", None, tokens(20)).reason is Reason.TOKEN_BUDGET


def test_tenant_concurrency_is_held_until_the_response_ends() -> None:
    clock = FakeClock()
    e = engine(clock, tenancy={"default": {"maxConcurrency": 1}, **SEPARATE})
    t = e.submit("a", None, tokens(10))
    clock.advance(3600)  # time alone gives nothing back: not a refilling bucket
    refused = e.submit("a", None, tokens(10))
    assert refused.reason is Reason.TENANT_CONCURRENCY and refused.retry_after_s > 0
    assert e.submit("b", None, tokens(10)).state is TicketState.ADMITTED  # other tenants unaffected
    e.release(t, Completion.SUCCESS)
    assert e.submit("a", None, tokens(10)).state is TicketState.ADMITTED


def test_tenant_rate_retry_after_is_the_refill_time() -> None:
    clock = FakeClock()
    e = engine(clock, tenancy={"default": {"tokensPerSecond": 10, "burstTokens": 100}})
    t = e.submit("a", None, tokens(100))
    e.release(t, Completion.SUCCESS, used_tokens=100)
    refused = e.submit("a", None, tokens(40))
    assert refused.reason is Reason.TENANT_RATE
    assert refused.retry_after_s == pytest.approx(4.0)
    clock.advance(4.0)
    assert e.submit("a", None, tokens(40)).state is TicketState.ADMITTED


def test_tenants_are_charged_by_usage_and_never_zero() -> None:
    e = engine(tenancy={"default": {"tokensPerSecond": 1, "burstTokens": 500}, **SEPARATE})
    t = e.submit("a", None, tokens(400))
    e.release(t, Completion.SUCCESS, used_tokens=50)
    assert e.tenants.state("a", 0).refill(e.clock()) == pytest.approx(450)
    t = e.submit("a", None, tokens(400))
    e.release(t, Completion.SUCCESS)  # no usage reported: charged the reservation
    assert e.tenants.state("a", 0).refill(e.clock()) == pytest.approx(50)
    assert e.counters.usage_missing_total == 1
    assert e.counters.charged_tokens_total == 450


def test_a_request_over_the_tenants_whole_bucket_is_too_large_not_rate_limited() -> None:
    e = engine(tenancy={"default": {"tokensPerSecond": 1, "burstTokens": 50}})
    t = e.submit("a", None, tokens(60))
    assert t.reason is Reason.REQUEST_TOO_LARGE and t.retry_after_s is None


def test_unknown_priority_class_is_a_bad_request() -> None:
    t = engine().submit("a", "gold", tokens(10))
    assert t.reason is Reason.BAD_REQUEST and "interactive" in t.message


def test_tenant_over_its_fair_share_is_demoted_behind_others() -> None:
    e = engine(tokenBudget=1000, maxConcurrency=100, tenancy=SEPARATE, **ONE_CLASS)
    hog = [e.submit("hog", None, tokens(300)) for _ in range(2)]
    small = e.submit("small", None, tokens(100))  # now two tenants active: fair share 500, borrowing cap 750
    demoted = e.submit("hog", None, tokens(300))  # 900 > 750 but there is room: admitted, demoted
    assert demoted.outcome is Outcome.ADMIT_DEMOTED and demoted.state is TicketState.ADMITTED
    waits = e.submit("hog", None, tokens(100))  # demoted and no room: behind the small tenant
    normal = e.submit("small", None, tokens(100))
    assert waits.state is normal.state is TicketState.QUEUED
    e.release(small, Completion.SUCCESS)  # room for one: the normal request goes first
    assert e.take_settled() == [normal]
    assert waits.state is TicketState.QUEUED and waits.demoted
    e.release(hog[0], Completion.SUCCESS)  # the hog is back within its share: promoted, admitted
    assert waits.state is TicketState.ADMITTED
    assert e.counters.admitted_demoted_total == 1


def test_a_lone_tenant_may_use_the_whole_budget() -> None:
    e = engine(**ONE_CLASS)
    assert all(e.submit("solo", None, tokens(250)).outcome is Outcome.ADMIT for _ in range(4))


def test_circuit_open_refuses_new_and_queued_requests() -> None:
    clock = FakeClock()
    e = engine(clock, **ONE_CLASS, circuitBreaker={"minSamples": 1})
    blockers = [e.submit("a", None, tokens(250)) for _ in range(4)]
    queued = e.submit("b", None, tokens(10))
    for t in blockers:
        e.release(t, Completion.FAILURE)  # 4 failures + ...
    e.release(queued, Completion.FAILURE)  # 5 in a row
    assert e.breaker_state is BreakerState.OPEN
    refused = e.submit("c", None, tokens(10))
    assert refused.reason is Reason.CIRCUIT_OPEN and refused.retry_after_s == pytest.approx(60)


def test_stalled_backend_opens_the_breaker_and_drops_the_queue() -> None:
    clock = FakeClock()
    e = engine(clock, queue={"maxWaitMs": 600_000}, **ONE_CLASS)
    e.observe_telemetry(Telemetry(generation_tokens_total=0.0))  # a backend with a token counter (vLLM)
    stuck = [e.submit("a", None, tokens(250)) for _ in range(4)]
    waiting = e.submit("b", None, tokens(10))
    clock.advance(29)
    e.note_progress()
    clock.advance(29)
    assert e.tick() == []
    clock.advance(1.1)
    settled = e.tick()
    assert e.breaker_state is BreakerState.OPEN
    assert settled == [waiting] and waiting.reason is Reason.CIRCUIT_OPEN
    for t in stuck:
        e.release(t, Completion.FAILURE)
    assert e.in_flight_requests == 0


def test_backend_token_counter_counts_as_progress() -> None:
    clock = FakeClock()
    e = engine(clock)
    e.submit("a", None, tokens(10))  # a long non-streaming request
    for total in range(0, 100, 10):
        clock.advance(10)
        e.observe_telemetry(Telemetry(generation_tokens_total=float(total)))
        e.tick()
    assert e.breaker_state is BreakerState.CLOSED


def test_kv_pressure_holds_the_queue_and_refuses_new_requests() -> None:
    clock = FakeClock()
    e = engine(clock, **ONE_CLASS)
    first = e.submit("a", None, tokens(900))
    e.observe_telemetry(Telemetry(kv_cache_usage=0.95))
    assert e.submit("a", None, tokens(10)).reason is Reason.KV_PRESSURE
    e.observe_telemetry(Telemetry(kv_cache_usage=0.5))
    queued = e.submit("a", None, tokens(200))
    e.observe_telemetry(Telemetry(kv_cache_usage=0.95))
    e.release(first, Completion.SUCCESS)
    assert queued.state is TicketState.QUEUED  # room, but the backend says it is full
    clock.advance(0.5)
    e.observe_telemetry(Telemetry(kv_cache_usage=0.80))
    assert queued.state is TicketState.ADMITTED


def test_frozen_kv_gauge_with_nothing_in_flight_reopens_the_gate() -> None:
    clock = FakeClock()
    e = engine(clock)
    t = e.submit("a", None, tokens(10))
    e.observe_telemetry(Telemetry(kv_cache_usage=0.99))
    e.release(t, Completion.SUCCESS)
    assert e.submit("a", None, tokens(10)).reason is Reason.KV_PRESSURE
    for _ in range(5):
        clock.advance(0.5)
        e.observe_telemetry(Telemetry(kv_cache_usage=0.99))  # vLLM idle: last value forever
    assert e.submit("a", None, tokens(10)).state is TicketState.ADMITTED


def test_a_probe_refused_later_in_the_pipeline_frees_its_slot() -> None:
    clock = FakeClock()
    e = engine(clock, tenancy={"default": {"maxConcurrency": 1}})
    hold = e.submit("a", None, tokens(10))
    e.breaker._open("test")
    clock.advance(60)
    for _ in range(20):  # every probe lands on a tenant at its limit
        e.submit("a", None, tokens(10))
    e.release(hold, Completion.SUCCESS)
    admitted = [e.submit(f"t{i}", None, tokens(10)) for i in range(10)]
    assert sum(t.state is TicketState.ADMITTED for t in admitted) >= 1


def test_reconfigure_keeps_in_flight_and_queued_requests() -> None:
    clock = FakeClock()
    e = engine(clock, **ONE_CLASS)
    running = e.submit("a", None, tokens(1000))
    queued = e.submit("a", None, tokens(500))
    e.reconfigure(admission(tokenBudget=2000, **ONE_CLASS), e.model)
    e.dispatch()
    assert queued.state is TicketState.ADMITTED
    e.release(running, Completion.SUCCESS)
    e.release(queued, Completion.SUCCESS)
    assert e.in_flight_tokens == 0


def test_every_rejection_is_counted_by_reason_and_tenant() -> None:
    e = engine(tenancy={"default": {"maxConcurrency": 1}})
    e.submit("a", None, tokens(10))
    e.submit("a", None, tokens(10))
    e.refuse("b", None, Reason.BAD_REQUEST, "not JSON")
    assert e.counters.rejected_total == {Reason.TENANT_CONCURRENCY: 1, Reason.BAD_REQUEST: 1}
    assert e.counters.tenants["a"].policy_rejected == 1 and e.counters.tenants["a"].admitted == 1


def test_a_tenants_in_flight_tokens_are_capped_until_released() -> None:
    clock = FakeClock()
    e = engine(clock, tokenBudget=10_000, tenancy={"default": {"maxInFlightTokens": 500}, **SEPARATE})
    long_context = e.submit("a", None, tokens(400))
    refused = e.submit("a", None, tokens(200))
    assert refused.reason is Reason.TENANT_CONCURRENCY and "500" in refused.message
    assert e.submit("b", None, tokens(400)).state is TicketState.ADMITTED  # its share, not everyone's
    assert e.submit("a", None, tokens(100)).state is TicketState.ADMITTED  # exactly at the cap
    assert e.submit("a", None, tokens(600)).reason is Reason.REQUEST_TOO_LARGE  # can never fit
    clock.advance(3600)
    assert e.submit("a", None, tokens(200)).reason is Reason.TENANT_CONCURRENCY  # time alone frees nothing
    e.release(long_context, Completion.SUCCESS)
    assert e.submit("a", None, tokens(200)).state is TicketState.ADMITTED


def _run_window(e, clock: FakeClock, ttft_s: float, busy_tokens: int) -> None:
    """One adaptive window: 30 requests with the given backend TTFT, ``busy_tokens`` held at once."""
    for _ in range(10):
        held = [e.submit(f"t{i}", None, tokens(busy_tokens // 3)) for i in range(3)]
        assert all(t.state is TicketState.ADMITTED for t in held)
        for t in held:
            e.release(t, Completion.SUCCESS, ttft_s=ttft_s)
    clock.advance(30)
    e.tick()


def test_adaptive_budget_shrinks_on_missed_slo_and_grows_back_when_busy_and_fast() -> None:
    clock = FakeClock()
    e = engine(clock, tokenBudget=10_000, maxConcurrency=100, adaptiveBudget={"enabled": True, "windowSeconds": 30},
               priorityClasses=[{"name": "std", "ttftSloMs": 1000}], defaultPriorityClass="std")  # fmt: skip
    assert e.token_budget == 10_000
    _run_window(e, clock, ttft_s=1.5, busy_tokens=100)  # p95 1.5x the SLO
    assert e.token_budget == 9_000
    for _ in range(20):
        _run_window(e, clock, ttft_s=1.5, busy_tokens=100)
    assert e.token_budget == 5_000  # never under minRatio x tokenBudget
    _run_window(e, clock, ttft_s=0.1, busy_tokens=100)
    assert e.token_budget == 5_000  # fast but idle: no reason to grow
    _run_window(e, clock, ttft_s=0.1, busy_tokens=4_500)
    assert e.token_budget == 5_500
    for _ in range(30):
        _run_window(e, clock, ttft_s=0.1, busy_tokens=int(e.token_budget * 0.9))
    assert e.token_budget == 20_000  # never over maxRatio x tokenBudget


def test_adaptive_budget_needs_enough_samples_and_a_whole_window() -> None:
    clock = FakeClock()
    e = engine(clock, tokenBudget=10_000, adaptiveBudget={"enabled": True, "windowSeconds": 30})
    for _ in range(5):
        e.release(e.submit("a", None, tokens(10)), Completion.SUCCESS, ttft_s=100.0)
    clock.advance(31)
    e.tick()
    assert e.token_budget == 10_000


def test_a_lone_request_runs_over_an_adapted_down_budget() -> None:
    clock = FakeClock()
    e = engine(clock, tokenBudget=10_000, maxConcurrency=100, adaptiveBudget={"enabled": True, "windowSeconds": 30},
               priorityClasses=[{"name": "std", "ttftSloMs": 1000}], defaultPriorityClass="std")  # fmt: skip
    for _ in range(10):
        _run_window(e, clock, ttft_s=5.0, busy_tokens=100)
    assert e.token_budget == 5_000
    big = e.submit("a", None, tokens(8_000))
    assert big.state is TicketState.ADMITTED
    assert e.submit("b", None, tokens(100)).state is not TicketState.ADMITTED


def test_in_flight_shedding_is_off_by_default_and_finds_overdue_requests() -> None:
    clock = FakeClock()
    tuning = EngineTuning(prior_s_per_token=0.01, shed_floor_s=1.0, duration_alpha=1.0)
    off = engine(clock, tuning=tuning)
    off.submit("a", None, tokens(100))
    clock.advance(3600)
    assert off.overdue() == []
    e = engine(clock, tuning=tuning, shedAfterMultiple=3)
    slow = e.submit("a", None, tokens(100))  # predicted 1 s: shed after 3 s
    clock.advance(2.9)
    quick = e.submit("b", None, tokens(10))
    assert e.overdue() == []
    clock.advance(0.2)
    assert e.overdue() == [slow]
    clock.advance(0.5)
    assert e.overdue() == [slow]  # 0.7 s old, predicted 0.1 s: still under the 1 s floor
    e.release(quick, Completion.SUCCESS, used_tokens=10)  # learns 0.07 s per token
    assert e.predicted_duration_s(slow) == pytest.approx(7.0)
    assert e.overdue() == []


def test_prefill_cap_keeps_a_long_prompt_from_joining_other_prefills() -> None:
    clock = FakeClock()
    e = engine(clock, tokenBudget=100_000, maxConcurrency=1000, maxPrefillTokens=1000, **ONE_CLASS)
    short = [e.submit("a", None, RequestCost.fixed(300, 10)) for _ in range(3)]
    assert all(t.state is TicketState.ADMITTED for t in short)
    long_prompt = e.submit("b", None, RequestCost.fixed(5000, 10))  # over the cap: waits, then runs alone
    assert long_prompt.state is TicketState.QUEUED
    for t in short[:2]:
        e.first_token(t, ttft_s=0.1)
    assert long_prompt.state is TicketState.QUEUED  # one prefill still in progress
    e.first_token(short[2], ttft_s=0.1)
    assert long_prompt.state is TicketState.ADMITTED and e.prefilling_tokens == 5000
    after = e.submit("c", None, RequestCost.fixed(50, 10))
    assert after.state is TicketState.QUEUED  # nothing joins the long prefill
    e.first_token(long_prompt, ttft_s=0.5)
    assert after.state is TicketState.ADMITTED


def test_short_work_goes_first_but_a_long_prompt_is_never_starved() -> None:
    clock = FakeClock()
    e = engine(clock, tokenBudget=100_000, maxConcurrency=1000, maxPrefillTokens=1000, tenancy=SEPARATE, **ONE_CLASS)
    first = e.submit("a", None, RequestCost.fixed(900, 10))
    long_prompt = e.submit("b", None, RequestCost.fixed(5000, 10))
    overtook = 0
    for i in range(500):  # a stream of short requests from ever new tenants
        t = e.submit(f"new-{i}", None, RequestCost.fixed(50, 10))
        overtook += t.state is TicketState.ADMITTED and long_prompt.state is TicketState.QUEUED
        for running in list(e.in_flight.values()):
            e.first_token(running, ttft_s=0.01)
        if long_prompt.state is TicketState.ADMITTED:
            break
    assert long_prompt.state is TicketState.ADMITTED
    assert 0 < overtook <= 5010 // 60 + 1  # overtaken by at most its own cost of others' work
    assert first.state is TicketState.ADMITTED


def test_non_streamed_prefills_end_after_the_predicted_prefill_time() -> None:
    clock = FakeClock()
    e = engine(clock, tuning=EngineTuning(prior_prefill_tokens_per_s=1000), tokenBudget=100_000, maxConcurrency=100,
               maxPrefillTokens=1000, **ONE_CLASS)  # fmt: skip
    first = e.submit("a", None, RequestCost.fixed(800, 10))  # non-streamed: no first token will be seen
    second = e.submit("a", None, RequestCost.fixed(800, 10))
    assert second.state is TicketState.QUEUED
    clock.advance(0.7)
    e.tick()
    assert second.state is TicketState.QUEUED
    clock.advance(0.2)  # 800 tokens at 1000 tokens/s
    e.tick()
    assert second.state is TicketState.ADMITTED
    e.release(first, Completion.SUCCESS)
    e.release(second, Completion.SUCCESS)
    assert e.prefilling_tokens == 0


def test_long_non_streamed_requests_are_not_a_stall_without_a_backend_token_counter() -> None:
    clock = FakeClock()
    e = engine(clock, tokenBudget=100_000)
    e.submit("a", None, tokens(2000))  # non-streamed, nothing to watch: an engine without metrics
    clock.advance(120)
    e.tick()
    assert e.breaker_state is BreakerState.CLOSED
    streamed = RequestCost(10, 100, 110, stream=True)
    e.submit("b", None, streamed)  # a stream that never produces a chunk is a stall
    clock.advance(29)
    e.tick()
    assert e.breaker_state is BreakerState.CLOSED
    clock.advance(1.1)
    e.tick()
    assert e.breaker_state is BreakerState.OPEN


def test_precheck_refuses_without_a_body_what_no_body_could_change() -> None:
    clock = FakeClock()
    e = engine(clock, tenancy={"default": {"tokensPerSecond": 10, "burstTokens": 100, "maxConcurrency": 2}, **SEPARATE})
    assert e.precheck("new", None) is None  # an unknown tenant: nothing to say before the body
    t = e.submit("a", None, tokens(100))
    e.release(t, Completion.SUCCESS)  # charged the reservation: bucket empty
    early = e.precheck("a", None)
    assert early is not None and early.reason is Reason.TENANT_RATE
    assert early.retry_after_s == pytest.approx(10.0)  # refill time of its last request's cost
    assert e.precheck("b", None) is None
    held = [e.submit("b", None, tokens(10)) for _ in range(2)]
    assert e.precheck("b", None).reason is Reason.TENANT_CONCURRENCY
    for h in held:
        e.release(h, Completion.SUCCESS, used_tokens=10)
    e.breaker._open("test")
    assert e.precheck("c", None).reason is Reason.CIRCUIT_OPEN
    assert e.counters.rejected_total == {Reason.TENANT_RATE: 1, Reason.TENANT_CONCURRENCY: 1, Reason.CIRCUIT_OPEN: 1}
    assert e.in_flight_requests == 0 and all(s.accepted == 0 for s in e.tenants.states.values())


def test_requests_stuck_since_before_the_trip_do_not_fail_a_half_open_probe_at_once() -> None:
    # A backend that hung with requests in flight, then recovered, leaving those requests stuck
    # until their (long) request timeout: a probe must get the whole stall window to show
    # progress, or the breaker re-opens on every half-open period until the old requests time out.
    clock = FakeClock()
    e = engine(clock, tokenBudget=100_000, **ONE_CLASS)
    e.observe_telemetry(Telemetry(generation_tokens_total=0.0))  # a backend with a token counter (vLLM)
    stuck = e.submit("a", None, tokens(100))
    clock.advance(30.1)
    e.tick()
    assert e.breaker_state is BreakerState.OPEN
    clock.advance(60)
    assert e.breaker_state is BreakerState.HALF_OPEN
    probe = e.submit("b", None, tokens(100))
    assert probe.state is TicketState.ADMITTED and probe.probe_epoch is not None
    clock.advance(0.1)
    e.tick()  # the probe has not had time to produce a token yet
    assert e.breaker_state is BreakerState.HALF_OPEN
    clock.advance(30)
    e.tick()  # but a probe that makes no progress for the whole window is a stall
    assert e.breaker_state is BreakerState.OPEN
    e.release(stuck, Completion.FAILURE)
    e.release(probe, Completion.FAILURE)


def test_every_sequence_of_a_request_takes_a_concurrency_slot() -> None:
    """A completion with a prompt array (or ``n`` > 1) runs one sequence per prompt and completion
    in the server (llama.cpp: a slot each): ``maxConcurrency`` counts them, not requests."""
    e = engine(maxConcurrency=2, **ONE_CLASS)
    body = {"model": "m", "prompt": ["Story:", "Tale:"], "max_tokens": 10}
    two_prompts = e.cost("/v1/completions", body)
    assert two_prompts.slots == 2
    first = e.submit("a", None, tokens(10))
    assert first.state is TicketState.ADMITTED
    waits = e.submit("b", None, two_prompts)  # one slot free, two needed
    assert waits.state is not TicketState.ADMITTED
    e.release(first, Completion.SUCCESS)
    assert waits.state is TicketState.ADMITTED
    assert e.in_flight_requests == 1 and e.capacity.slots == 2
    third = e.submit("c", None, tokens(10))
    assert third.state is not TicketState.ADMITTED  # both slots are the prompt array's
