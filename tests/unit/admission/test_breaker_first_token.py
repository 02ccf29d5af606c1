"""The breaker judges a streamed request's TTFT when its first token arrives, not when it ends.

With long generations a request ends minutes after its first token: a breaker that learned the
TTFT only at the end kept a replica turned slow in service that long (simulator, issue #13:
``mixed-34b-a100``, one replica 10x slower at 600 s, breaker open at 957 s). The proxy calls
:meth:`Engine.first_token` at the first streamed event, then :meth:`Engine.release` at the end.
"""

import heapq
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.admission.breaker import BreakerState, Completion
from tidegate.admission.cost import RequestCost
from tidegate.admission.engine import Engine
from tidegate.admission.reasons import Outcome
from tidegate.admission.ticket import Ticket

from .helpers import FakeClock, engine

HEALTHY_TTFT_S = 0.3
GENERATION_S = 60.0


def replica(clock: FakeClock, **breaker: object) -> Engine:
    return engine(clock, tokenBudget=1_000_000, maxConcurrency=512, circuitBreaker={"minSamples": 4, **breaker})


def stream(e: Engine, clock: FakeClock, until_s: float, ttft_s: object, every_s: float = 5.0) -> dict[str, Any]:
    """One streamed request every ``every_s`` until ``until_s``: its first token ``ttft_s(t)`` after
    it was admitted at ``t``, its last one ``GENERATION_S`` later. Returns when things happened:
    ``opened`` (the breaker first opened, ``why`` with its reason), ``first_slow_end`` (the first
    request with a TTFT over 1 s ended)."""
    events: list[tuple[float, int, str, Ticket | None, float]] = []
    seen: dict[str, Any] = {}
    n = 0
    t = clock.now
    while t < until_s:
        heapq.heappush(events, (t, n, "arrive", None, 0.0))
        n += 1
        t += every_s
    while events:
        at, _, kind, ticket, ttft = heapq.heappop(events)
        clock.now = at
        if kind == "arrive":
            ticket = e.submit("t", "interactive", RequestCost.fixed(200, 2000))
            if ticket.outcome is not Outcome.REJECT:
                ttft = ttft_s(at)  # type: ignore[operator]
                heapq.heappush(events, (at + ttft, n, "first", ticket, ttft))
                heapq.heappush(events, (at + ttft + GENERATION_S, n + 1, "end", ticket, ttft))
                n += 2
        elif kind == "first":
            e.first_token(ticket, ttft)  # type: ignore[arg-type]
        else:
            e.release(ticket, Completion.SUCCESS, ttft_s=ttft)  # type: ignore[arg-type]
            if ttft > 1.0:
                seen.setdefault("first_slow_end", at)
        if e.breaker_state is BreakerState.OPEN and "opened" not in seen:
            seen["opened"], seen["why"] = at, e.breaker.last_trip_reason
    return seen


def test_a_replica_whose_first_tokens_turn_10x_slower_opens_before_those_requests_end() -> None:
    """Healthy for 5 minutes (TTFT 0.3 s, 60 s generations), then the same requests take 3 s to a
    first token (over the 2 s interactive SLO): the breaker opens within seconds of the first slow
    tokens, a minute before the first slow request ends and so stops refusing nobody for that minute."""
    clock = FakeClock(0.0)
    e = replica(clock)
    seen = stream(e, clock, 400.0, lambda t: HEALTHY_TTFT_S if t < 300.0 else 10 * HEALTHY_TTFT_S)
    assert "opened" in seen, "a replica 10x slower to a first token never opened its breaker"
    assert seen["opened"] < 320.0, seen
    assert seen["opened"] < seen["first_slow_end"] - 50.0, seen
    assert "TTFT" in seen["why"]


def test_a_healthy_replica_with_long_generations_stays_closed_and_counts_each_ttft_once() -> None:
    """TTFT seen at the first token and again at release is one sample: with ``minSamples`` 4 the
    baseline is trusted after 4 requests, not after 2 that were counted twice."""
    clock = FakeClock(0.0)
    e = replica(clock)
    for n in range(4):
        ticket = e.submit("t", "interactive", RequestCost.fixed(200, 2000))
        e.first_token(ticket, HEALTHY_TTFT_S)
        if n >= 2:
            e.first_token(ticket, HEALTHY_TTFT_S)  # a second call for the same request changes nothing
        e.release(ticket, Completion.SUCCESS, ttft_s=HEALTHY_TTFT_S)
        if n < 3:
            assert e.breaker.baseline_for(200) is None, f"trusted after {n + 1} requests"
    assert e.breaker.baseline_for(200) is not None
    seen = stream(e, clock, 600.0, lambda t: HEALTHY_TTFT_S)
    assert "opened" not in seen and e.breaker_state is BreakerState.CLOSED


def tripped_on_latency(clock: FakeClock, **breaker: object) -> Engine:
    e = replica(clock, **breaker)
    seen = stream(e, clock, 120.0, lambda t: HEALTHY_TTFT_S if t < 100.0 else 10 * HEALTHY_TTFT_S)
    assert "opened" in seen
    clock.advance(e.breaker.retry_after_s())
    assert e.breaker_state is BreakerState.HALF_OPEN
    return e


def probes(e: Engine, n: int) -> list[Ticket]:
    """Arrivals until ``n`` probes are admitted (half-open lets every other one through)."""
    admitted = []
    while len(admitted) < n:
        ticket = e.submit("t", "interactive", RequestCost.fixed(200, 2000))
        if ticket.outcome is not Outcome.REJECT:
            admitted.append(ticket)
    return admitted


def test_a_probe_slow_to_its_first_token_reopens_the_breaker_at_once() -> None:
    clock = FakeClock(0.0)
    e = tripped_on_latency(clock, halfOpenRequests=1)
    (probe,) = probes(e, 1)
    clock.advance(10 * HEALTHY_TTFT_S)
    e.first_token(probe, 10 * HEALTHY_TTFT_S)
    assert e.breaker_state is BreakerState.OPEN  # not a minute later, when the probe ends
    assert "1/1 half-open probes failed" in e.breaker.last_trip_reason
    clock.advance(GENERATION_S)
    e.release(probe, Completion.SUCCESS, ttft_s=10 * HEALTHY_TTFT_S)
    assert e.breaker.trips == 2  # its end reopened nothing more


@pytest.mark.parametrize("end", [Completion.SUCCESS, Completion.FAILURE])
def test_a_slow_probe_counts_as_one_failed_probe_not_two(end: Completion) -> None:
    """5 probes, 80% must succeed (one failure allowed): one slow to its first token fails once;
    its end (a complete answer, or a stream broken after that token) is not judged again, so four
    fast ones close the breaker."""
    clock = FakeClock(0.0)
    e = tripped_on_latency(clock)
    slow, *fast = probes(e, 5)
    clock.advance(10 * HEALTHY_TTFT_S)
    e.first_token(slow, 10 * HEALTHY_TTFT_S)
    assert e.breaker_state is BreakerState.HALF_OPEN
    e.release(slow, end, ttft_s=10 * HEALTHY_TTFT_S)
    assert e.breaker_state is BreakerState.HALF_OPEN
    for ticket in fast:
        e.first_token(ticket, HEALTHY_TTFT_S)
        e.release(ticket, Completion.SUCCESS, ttft_s=HEALTHY_TTFT_S)
    assert e.breaker_state is BreakerState.CLOSED, e.breaker.last_trip_reason


def test_a_probe_fast_to_its_first_token_is_decided_by_how_it_ends() -> None:
    clock = FakeClock(0.0)
    e = tripped_on_latency(clock, halfOpenRequests=1)
    (probe,) = probes(e, 1)
    e.first_token(probe, HEALTHY_TTFT_S)
    assert e.breaker_state is BreakerState.HALF_OPEN  # one good token is not yet a good answer
    e.release(probe, Completion.FAILURE, ttft_s=HEALTHY_TTFT_S)
    assert e.breaker_state is BreakerState.OPEN


def test_slow_first_tokens_of_requests_whose_clients_then_left_still_open_the_breaker() -> None:
    """A client that gives up after a slow first token cancels its request: the cancel says nothing
    about the replica (no error), the slow first token does."""
    clock = FakeClock(0.0)
    e = replica(clock)
    stream(e, clock, 100.0, lambda t: HEALTHY_TTFT_S)
    for _ in range(10):
        ticket = e.submit("t", "interactive", RequestCost.fixed(200, 2000))
        if ticket.outcome is Outcome.REJECT:
            break
        clock.advance(10 * HEALTHY_TTFT_S)
        e.first_token(ticket, 10 * HEALTHY_TTFT_S)
        e.release(ticket, Completion.CANCELLED)
    assert e.breaker_state is BreakerState.OPEN and "TTFT" in e.breaker.last_trip_reason


def test_non_streamed_requests_are_still_judged_at_release() -> None:
    """No first token seen: the TTFT given at release (if any) is the evidence, as before."""
    clock = FakeClock(0.0)
    e = replica(clock)
    for ttft in [HEALTHY_TTFT_S] * 10 + [10 * HEALTHY_TTFT_S] * 10:
        ticket = e.submit("t", "interactive", RequestCost.fixed(200, 2000))
        if ticket.outcome is Outcome.REJECT:
            break
        clock.advance(1.0)
        e.release(ticket, Completion.SUCCESS, ttft_s=ttft)
    assert e.breaker_state is BreakerState.OPEN and "TTFT" in e.breaker.last_trip_reason


ENDS = [Completion.SUCCESS, Completion.SUCCESS, Completion.FAILURE, Completion.NEUTRAL, Completion.CANCELLED]


@settings(max_examples=300, deadline=None)
@given(
    fates=st.lists(st.tuples(st.sampled_from(["none", "fast", "slow"]), st.sampled_from(ENDS)), min_size=1, max_size=8)
)
def test_half_open_probes_never_lock_the_breaker_out_whatever_their_first_token_and_end(
    fates: list[tuple[str, Completion]],
) -> None:
    """Every probe frees or decides its slot exactly once, whether its first token came in time,
    late or never, and however it ended: afterwards the breaker is closed, open, or lets a probe
    through within two arrivals."""
    clock = FakeClock(0.0)
    e = tripped_on_latency(clock)
    running = []
    for first, end in fates:
        for _ in range(2):
            ticket = e.submit("t", "interactive", RequestCost.fixed(200, 2000))
            if ticket.outcome is not Outcome.REJECT:
                running.append((ticket, first, end))
                break
    for ticket, first, _ in running:
        if first != "none":
            e.first_token(ticket, HEALTHY_TTFT_S if first == "fast" else 100 * HEALTHY_TTFT_S)  # slow for any work
    for ticket, _, end in running:
        e.release(ticket, end)
    if e.breaker_state is BreakerState.HALF_OPEN:
        assert any(e.breaker.allow()[0] for _ in range(2)), "half-open with no probe slot left"
