"""The adaptive budget, on by default over the engine's own budget: it settles at steady load and
does not collapse under a spike.

The real :class:`~tidegate.admission.engine.Engine` runs against a small model server on a virtual
clock: a request admitted while ``T`` tokens are in flight sees a backend TTFT of
``0.2 + 1.8 (T / knee)^2`` seconds (the interactive SLO, 2 s, is missed past ``knee`` tokens) and
runs :data:`DURATION_S`. Arrivals are deterministic, above what the replica serves, so the budget is
always busy and the controller always has a reason to move.
"""

import heapq
import itertools

import pytest

from tidegate.admission.breaker import Completion
from tidegate.admission.cost import RequestCost
from tidegate.admission.engine import BackendCapacity, Engine, Telemetry
from tidegate.admission.ticket import Ticket, TicketState
from tidegate.api.admission import AdmissionSpec
from tidegate.api.serving import ModelSpec

from .helpers import FakeClock

pytestmark = pytest.mark.unit

KV_TOKENS = 200_000
"""The engine's KV cache: the adaptive budget's base."""
COST_TOKENS = 2_000
DURATION_S = 8.0
WINDOW_S = 60.0
STEP_S = 0.1


def run(knee_tokens: float, rate_per_s: "list[tuple[float, float]]", until_s: float) -> list[int]:
    """Drive one replica; ``rate_per_s``: (from_s, arrivals per second) steps. Returns the budget in
    force at the end of every adaptive window."""
    clock = FakeClock(0.0)
    engine = Engine(AdmissionSpec(), ModelSpec(name="m", max_context_tokens=8192), clock)
    engine.note_backend_healthy()
    engine.observe_telemetry(Telemetry(capacity=BackendCapacity(kv_tokens=KV_TOKENS)))
    assert engine.token_budget == KV_TOKENS
    events: list[tuple[float, int, str, Ticket, float]] = []
    seq = itertools.count()

    def started(ticket: Ticket) -> None:
        ttft = 0.2 + 1.8 * (engine.in_flight_tokens / knee_tokens) ** 2
        heapq.heappush(events, (clock.now + ttft, next(seq), "first", ticket, ttft))
        heapq.heappush(events, (clock.now + max(ttft, DURATION_S), next(seq), "done", ticket, ttft))

    budgets, next_window, credit = [], WINDOW_S, 0.0
    while clock.now < until_s:
        clock.advance(STEP_S)
        rate = [r for start, r in rate_per_s if start <= clock.now][-1]
        credit += rate * STEP_S
        while credit >= 1:
            credit -= 1
            ticket = engine.submit("t", "interactive", RequestCost.fixed(COST_TOKENS // 2, COST_TOKENS // 2))
            if ticket.state is TicketState.ADMITTED:
                started(ticket)
        while events and events[0][0] <= clock.now:
            _, _, kind, ticket, ttft = heapq.heappop(events)
            if kind == "first":
                engine.first_token(ticket, ttft)
            else:
                engine.release(ticket, Completion.SUCCESS, ttft_s=ttft, used_tokens=COST_TOKENS)
        for ticket in engine.tick() + engine.take_settled():
            if ticket.state is TicketState.ADMITTED:
                started(ticket)
        if clock.now >= next_window:
            budgets.append(engine.token_budget)
            next_window += WINDOW_S
    return budgets


def reversals(values: list[int]) -> int:
    moves = [b - a for a, b in itertools.pairwise(values) if b != a]
    return sum(1 for a, b in itertools.pairwise(moves) if (a > 0) != (b > 0))


def test_at_steady_load_it_settles_where_the_slo_is_met_without_oscillating() -> None:
    knee = 0.6 * KV_TOKENS  # the engine holds more than it serves within the SLO
    budgets = run(knee, [(0.0, 12.0)], until_s=25 * WINDOW_S)
    assert budgets[0] < KV_TOKENS  # it moved
    settled = budgets[10:]
    assert max(settled) <= knee  # shrunk until the TTFT p95 is within the SLO ...
    assert min(settled) >= 0.5 * knee  # ... and not past where it would grow again
    assert reversals(settled) == 0 and len(set(settled)) <= 2


def test_a_spike_held_back_by_admission_does_not_collapse_it() -> None:
    knee = 1.2 * KV_TOKENS  # the engine serves its whole KV cache within the SLO
    steady, spike = 10.0, 60.0  # a replica serves ~12.5 requests/s at the full budget
    budgets = run(knee, [(0.0, steady), (5 * WINDOW_S, spike), (12 * WINDOW_S, steady)], until_s=16 * WINDOW_S)
    # time queued in the sidecar is no backend TTFT: the spike never shrinks the budget
    assert min(budgets) >= KV_TOKENS
    assert budgets[-1] >= KV_TOKENS
