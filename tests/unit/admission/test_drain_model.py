"""The drain model behind Retry-After: a refused client that retries when told to gets in.

A fake clock replays what the engine predicts against: every request runs exactly the learned
mean duration, and a request is released when its time is up."""

import pytest

from tidegate.admission.breaker import Completion
from tidegate.admission.engine import Engine, EngineTuning
from tidegate.admission.reasons import Reason
from tidegate.admission.ticket import Ticket, TicketState

from .helpers import FakeClock, engine, tokens

DURATION_S = 10.0
STEP_S = 0.25
ONE_CLASS = {"priorityClasses": [{"name": "std", "ttftSloMs": 60_000}], "defaultPriorityClass": "std"}


def _run_until(e: Engine, clock: FakeClock, until_s: float, started: dict[int, float], tickets: list[Ticket]) -> None:
    """Advance to ``until_s``: requests end DURATION_S after admission, queued ones are dispatched."""
    while clock.now < until_s - 1e-9:
        clock.advance(min(STEP_S, until_s - clock.now))
        for t in list(e.capacity.in_flight.values()):
            if t.admitted_at_s is not None and clock.now - t.admitted_at_s >= DURATION_S - 1e-9:
                e.release(t, Completion.SUCCESS)
        e.tick()
        for t in tickets:
            if t.state is TicketState.ADMITTED and t.id not in started:
                started[t.id] = clock.now


@pytest.mark.parametrize(
    ("slo_ms", "max_depth", "reason"),
    [(9_000, 128, Reason.SLO_UNREACHABLE), (60_000, 2, Reason.QUEUE_FULL)],
)
def test_retry_after_of_a_capacity_refusal_is_about_the_real_wait_not_minutes(
    slo_ms: int, max_depth: int, reason: Reason
) -> None:
    # 8 short requests fill the 8 slots (admitted one after another over a duration, so on average
    # half done); two 5000-token requests queue behind them in a 10000-token budget; a third is
    # refused (it cannot start within its 9 s deadline, or the queue is full). The old model took
    # the 80 in-flight tokens as the only source of free tokens: the 5080 missing ones "took"
    # 10/2 x 5080/80 = 317.5 s, a Retry-After OpenAI SDKs ignore (> 60 s). It starts after 11.25 s.
    clock = FakeClock(0.0)
    classes = {"priorityClasses": [{"name": "std", "ttftSloMs": slo_ms}], "defaultPriorityClass": "std"}
    e = engine(clock, EngineTuning(prior_duration_s=DURATION_S), tokenBudget=10_000, maxConcurrency=8,
               queue={"maxWaitMs": 60_000, "maxDepth": max_depth}, **classes)  # fmt: skip
    started: dict[int, float] = {}
    tickets: list[Ticket] = []
    for i in range(8):
        _run_until(e, clock, i * DURATION_S / 8, started, tickets)
        tickets.append(e.submit(f"short{i}", None, tokens(10)))
    tickets += [e.submit("big", None, tokens(5000)) for _ in range(2)]
    refused = e.submit("big", None, tokens(5000))
    assert refused.state is TicketState.REJECTED and refused.reason is reason
    retry_after_s = refused.retry_after_s
    assert retry_after_s is not None and 0 < retry_after_s <= 2 * DURATION_S

    refused_at = clock.now
    _run_until(e, clock, refused_at + retry_after_s, started, tickets)
    retry = e.submit("big", None, tokens(5000))  # the client comes back when told
    tickets.append(retry)
    assert retry.state in (TicketState.ADMITTED, TicketState.QUEUED)  # not refused again
    if retry.state is TicketState.ADMITTED:
        started[retry.id] = clock.now
    _run_until(e, clock, clock.now + 3 * DURATION_S, started, tickets)
    real_wait_s = started[retry.id] - refused_at  # when a request sent at the refusal could start
    assert real_wait_s - retry_after_s <= DURATION_S / 2  # told to come back no earlier than useful
    assert retry_after_s <= real_wait_s + 1e-9  # nor later than it could have started


def test_queued_work_drains_at_the_replica_throughput_not_at_the_in_flight_rate() -> None:
    clock = FakeClock(0.0)
    e = engine(clock, EngineTuning(prior_duration_s=DURATION_S), tokenBudget=10_000, maxConcurrency=1,
               queue={"maxWaitMs": 600_000}, **ONE_CLASS)  # fmt: skip
    e.submit("a", None, tokens(100))
    # One slot: 20 requests ahead run one after another, DURATION_S each, behind the running one.
    wait = e.capacity.wait_s(e.submit("probe", None, tokens(100)), 0, 20)
    assert wait == pytest.approx(DURATION_S / 2 + 20 * DURATION_S)
