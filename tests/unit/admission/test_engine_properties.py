"""Invariants of the engine under arbitrary interleavings (hypothesis, fake clock).

- reserved tokens (and requests) in flight never exceed the budget (and the concurrency);
- the engine's in-flight totals always equal the sum over admitted tickets;
- every admitted ticket is released exactly once; after releasing or cancelling everything the
  engine is back to zero: no tokens, slots or tenant state leak on any path;
- under backlog, tenants are served tokens in proportion to their weights within the self-clocked
  fair queueing margin;
- with ``tokenBudget == maxContextTokens`` every single-sequence request that fits the context is
  admitted by an idle replica (the reservation never exceeds the context per sequence).
"""

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.admission.breaker import Completion
from tidegate.admission.cost import CHAT_PATH, CostError
from tidegate.admission.engine import Engine, EngineTuning, Telemetry
from tidegate.admission.ticket import Ticket, TicketState, TicketStateError
from tidegate.api.serving import ModelSpec

from .helpers import FakeClock, admission, engine, tokens

TENANTS = ["a", "b", "c", "d"]
op = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(TENANTS), st.sampled_from(["interactive", "batch"]),
              st.integers(1, 1200)),
    st.tuples(st.just("release"), st.integers(0, 1000), st.sampled_from(list(Completion)), st.booleans()),
    st.tuples(st.just("cancel"), st.integers(0, 1000)),
    st.tuples(st.just("advance"), st.floats(0.0, 30.0)),
    st.tuples(st.just("kv"), st.floats(0.0, 1.0)),
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op, max_size=120), depth=st.integers(0, 6))
def test_budget_holds_and_every_admit_is_released_exactly_once(ops: list[tuple], depth: int) -> None:
    clock = FakeClock()
    e = engine(
        clock,
        tuning=EngineTuning(prior_duration_s=1.0),
        queue={"maxDepth": depth, "maxWaitMs": 20_000},
        tenancy={
            "default": {"maxConcurrency": 3, "tokensPerSecond": 200, "burstTokens": 1500, "maxInFlightTokens": 1800}
        },
        circuitBreaker={"minSamples": 3},
    )
    tickets: list[Ticket] = []
    released: set[int] = set()

    def check() -> None:
        assert 0 <= e.in_flight_tokens <= 1000
        assert 0 <= e.in_flight_requests <= 4
        assert e.in_flight_tokens == sum(t.reserved_tokens for t in e.in_flight.values())
        assert all(t.state is TicketState.ADMITTED for t in e.in_flight.values())
        assert e.queue.depth == sum(t.state is TicketState.QUEUED for t in tickets)

    for step in ops:
        kind = step[0]
        if kind == "submit":
            tickets.append(e.submit(step[1], step[2], tokens(step[3])))
        elif kind == "release":
            admitted = [t for t in tickets if t.state is TicketState.ADMITTED]
            if admitted:
                t = admitted[step[1] % len(admitted)]
                e.release(t, step[2], ttft_s=0.01, used_tokens=t.reserved_tokens // 2 if step[3] else None)
                assert t.id not in released
                released.add(t.id)
        elif kind == "cancel":
            queued = [t for t in tickets if t.state is TicketState.QUEUED]
            if queued:
                assert e.cancel(queued[step[1] % len(queued)])
        elif kind == "advance":
            clock.advance(step[1])
            e.tick()
        else:
            e.observe_telemetry(Telemetry(kv_cache_usage=step[1]))
        check()

    for t in tickets:
        if t.state is TicketState.QUEUED:
            e.cancel(t)
    while e.in_flight:
        t = next(iter(e.in_flight.values()))
        e.release(t, Completion.SUCCESS)
        released.add(t.id)
        try:
            e.release(t, Completion.SUCCESS)
            raise AssertionError("a second release must raise")
        except TicketStateError:
            pass
    admitted_ever = {t.id for t in tickets if t.admitted_at_s is not None}
    assert admitted_ever == released
    assert e.counters.admitted_total == len(admitted_ever)
    assert e.in_flight_tokens == 0 and e.queue.depth == 0 and e.queue.tokens == 0
    assert all(s.accepted == s.accepted_tokens == s.running_tokens == 0 for s in e.tenants.states.values())
    clock.advance(3600)
    e.tenants.prune(clock())
    assert e.tenants.states == {}


MAX_COST = 100
WARMUP_STEPS = 200  # the first tenant fills the idle budget alone before the others queue
MEASURED_STEPS = 1000
SHARE_MARGIN = 0.03  # of the tokens served while every tenant is backlogged


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.sampled_from([1.0, 2.0, 3.0, 4.0]), min_size=2, max_size=4),
    costs=st.lists(st.integers(10, MAX_COST), min_size=50, max_size=50),
    borrowing_cap=st.sampled_from([1.5, 10.0]),
)
def test_backlogged_tenants_are_served_in_proportion_to_their_weights(
    weights: list[float], costs: list[int], borrowing_cap: float
) -> None:
    names = [f"t{i}" for i in range(len(weights))]
    clock = FakeClock()
    e = engine(
        clock,
        tokenBudget=1000,
        maxConcurrency=1000,
        priorityClasses=[{"name": "std", "ttftSloMs": 3_600_000}],
        defaultPriorityClass="std",
        queue={"maxDepth": 1000, "maxWaitMs": 600_000},
        tenancy={"borrowingCap": borrowing_cap, "tenants": [{"name": n, "weight": w} for n, w in zip(names, weights, strict=True)]},
    )  # fmt: skip
    served: dict[str, int] = defaultdict(int)
    queued: dict[str, int] = defaultdict(int)
    draw = iter(costs * 100)
    in_order: list[Ticket] = []

    measuring = False

    def on_admit(t: Ticket) -> None:
        if measuring:
            served[t.tenant] += t.reserved_tokens
        in_order.append(t)

    for step in range(WARMUP_STEPS + MEASURED_STEPS):
        measuring = step >= WARMUP_STEPS
        for name, weight in zip(names, weights, strict=True):  # keep every tenant backlogged
            while queued[name] < 3 * weight:  # a heavier tenant drains its queue faster: deeper, or it idles
                t = e.submit(name, None, tokens(next(draw)))
                assert t.state in (TicketState.QUEUED, TicketState.ADMITTED), t.reason
                if t.state is TicketState.QUEUED:
                    queued[name] += 1
                else:
                    on_admit(t)
        clock.advance(0.01)
        e.release(in_order.pop(0), Completion.SUCCESS)  # oldest in flight completes
        for t in e.take_settled():
            queued[t.tenant] -= 1
            on_admit(t)

    # Self-clocked fair queueing bound over any interval where all flows are backlogged:
    # |S_i/w_i - S_j/w_j| <= c_max/w_i + c_max/w_j. Demotion (borrowingCap 1.5) only corrects the
    # warm-up burst and is promoted away once a tenant is back within its share: same bound.
    # Service is counted at dispatch over a window cut at arbitrary points, so each flow may have
    # one more request inside it than the bound's interval: twice the bound (hypothesis found 220
    # against 200 for two equal weights).
    normalized = [served[n] / w for n, w in zip(names, weights, strict=True)]
    for i, wi in enumerate(weights):
        for j, wj in enumerate(weights):
            assert abs(normalized[i] - normalized[j]) <= 2 * (MAX_COST / wi + MAX_COST / wj) + 1e-6
    total, total_weight = sum(served.values()), sum(weights)
    for n, w in zip(names, weights, strict=True):
        assert abs(served[n] / total - w / total_weight) <= SHARE_MARGIN


@settings(max_examples=200, deadline=None)
@given(
    context=st.sampled_from([2048, 4096, 8192]),
    words=st.integers(0, 3000),
    max_tokens=st.none() | st.integers(1, 10_000),
    safety=st.floats(1.0, 4.0),
)
def test_a_budget_of_one_context_admits_every_single_sequence_request_that_fits_the_context(
    context: int, words: int, max_tokens: int | None, safety: float
) -> None:
    e = Engine(
        admission(tokenBudget=context, safetyFactor=safety),
        ModelSpec(name="m", max_context_tokens=context),
        FakeClock(),
    )
    body = {"messages": [{"role": "user", "content": " ".join(["word"] * words)}], "max_tokens": max_tokens}
    try:
        cost = e.cost(CHAT_PATH, body)
    except CostError:
        return  # a prompt over the context: the 400 the server would give too
    assert e.submit("t", None, cost).state is TicketState.ADMITTED
