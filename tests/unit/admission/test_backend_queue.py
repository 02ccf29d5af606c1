"""The model server's own queue as a load signal: new work waits in the sidecar's fair queue while
the engine queues requests itself, and the stale / frozen rules of the KV gauge apply to it."""

from typing import Any

import pytest

from tidegate.admission.breaker import Completion
from tidegate.admission.engine import Engine, EngineTuning, Telemetry
from tidegate.admission.gate import QueueSignal
from tidegate.admission.reasons import Reason
from tidegate.admission.ticket import TicketState
from tidegate.api.admission import StalePolicy
from tidegate.api.serving import ModelSpec

from .helpers import FakeClock, admission, tokens

ONE_CLASS = {"priorityClasses": [{"name": "std", "ttftSloMs": 60_000}], "defaultPriorityClass": "std"}


def llamacpp(clock: FakeClock, tuning: EngineTuning | None = None, **overrides: Any) -> Engine:
    """An engine in front of llama.cpp (no KV gauge: the deferred queue is its load signal); requests
    take 1 s until measured, so waits behind the engine's queue fit the 10 s queue deadline."""
    model = ModelSpec(name="m", engine="llamacpp", max_context_tokens=4096)
    return Engine(admission(**{**ONE_CLASS, **overrides}), model, clock, tuning or EngineTuning(prior_duration_s=1.0))


def test_new_work_waits_in_the_fair_queue_while_the_engine_queues_and_resumes_when_it_is_empty() -> None:
    clock = FakeClock()
    e = llamacpp(clock)
    first = e.submit("a", None, tokens(100))
    assert first.state is TicketState.ADMITTED
    e.observe_telemetry(Telemetry(requests_running=1, requests_queued=2))  # other traffic is deferred
    held = e.submit("b", None, tokens(100))
    assert held.state is TicketState.QUEUED  # room in the budget, but the engine is queueing already
    assert e.backend_queue_held
    clock.advance(0.5)
    e.observe_telemetry(Telemetry(requests_running=1, requests_queued=1))
    assert held.state is TicketState.QUEUED
    e.observe_telemetry(Telemetry(requests_running=1, requests_queued=0))
    assert held.state is TicketState.ADMITTED and held in e.take_settled()
    assert not e.backend_queue_held


def test_held_work_is_refused_by_the_queue_deadline_with_a_retry_time() -> None:
    clock = FakeClock()
    e = llamacpp(clock, queue={"maxWaitMs": 2000})
    e.submit("a", None, tokens(100))
    e.observe_telemetry(Telemetry(requests_running=1, requests_queued=1))
    held = e.submit("b", None, tokens(100))
    assert held.state is TicketState.QUEUED  # predicted start 1.5 s: within the 2 s deadline
    clock.advance(2.0)
    e.observe_telemetry(Telemetry(requests_running=1, requests_queued=1))  # still queueing
    assert e.expire() == [held]
    assert held.reason is Reason.QUEUE_TIMEOUT and held.retry_after_s > 0


def test_a_start_behind_a_long_engine_queue_that_misses_the_slo_is_refused_at_once() -> None:
    clock = FakeClock()
    e = llamacpp(clock, EngineTuning(prior_duration_s=10.0), priorityClasses=[{"name": "std", "ttftSloMs": 2000}])
    e.submit("a", None, tokens(100))
    e.observe_telemetry(Telemetry(requests_running=2, requests_queued=4))
    late = e.submit("b", None, tokens(100))
    # 4 queued + this one = 5 departures of 2 running: 10/2 s for the running pair + 10 s x 3/2 rounds
    assert late.reason is Reason.SLO_UNREACHABLE
    assert late.retry_after_s == pytest.approx(5.0 + 15.0)
    assert clock.now == late.submitted_at_s


def test_with_queueing_disabled_an_engine_queue_refuses_with_concurrency() -> None:
    clock = FakeClock()
    e = llamacpp(clock, queue={"maxDepth": 0})
    e.observe_telemetry(Telemetry(requests_running=2, requests_queued=1))
    refused = e.submit("a", None, tokens(10))
    assert refused.reason is Reason.CONCURRENCY and refused.retry_after_s > 0
    assert "1 requests waiting in its own queue" in refused.message


def test_max_queued_and_the_switch() -> None:
    clock = FakeClock()
    e = llamacpp(clock, backendQueue={"maxQueued": 2})
    e.submit("a", None, tokens(10))
    e.observe_telemetry(Telemetry(requests_queued=2))
    assert e.submit("a", None, tokens(10)).state is TicketState.ADMITTED  # within what the engine may queue
    e.observe_telemetry(Telemetry(requests_queued=3))
    assert e.submit("a", None, tokens(10)).state is TicketState.QUEUED
    off = llamacpp(clock, backendQueue={"enabled": False})
    off.observe_telemetry(Telemetry(requests_queued=50))
    assert off.submit("a", None, tokens(10)).state is TicketState.ADMITTED


def test_a_queue_reading_unchanged_while_nothing_is_in_flight_here_is_not_evidence() -> None:
    clock = FakeClock()
    e = llamacpp(clock, tuning=EngineTuning(frozen_after_s=2.0, prior_duration_s=1.0))
    first = e.submit("a", None, tokens(10))
    e.observe_telemetry(Telemetry(requests_queued=3))
    held = e.submit("a", None, tokens(10))
    e.release(first, Completion.SUCCESS)
    assert held.state is TicketState.QUEUED  # nothing of ours in flight, but the reading is fresh news
    for _ in range(4):
        clock.advance(0.5)
        e.observe_telemetry(Telemetry(requests_queued=3))  # frozen at 3 for 2 s
    assert held.state is TicketState.ADMITTED


@pytest.mark.parametrize(("on_stale", "held"), [("failOpen", False), ("failClosed", True)])
def test_a_stale_queue_reading_follows_on_stale(on_stale: str, held: bool) -> None:
    clock = FakeClock()
    e = llamacpp(clock, telemetry={"staleAfterSeconds": 5, "onStale": on_stale})
    e.submit("a", None, tokens(10))
    e.observe_telemetry(Telemetry(requests_queued=0))
    clock.advance(5.5)  # no reading since: /metrics unreachable
    assert (e.submit("a", None, tokens(10)).state is TicketState.QUEUED) is held
    assert e.telemetry_age_s() == pytest.approx(5.5)


def test_failclosed_applies_to_a_signal_the_engine_serves_but_that_was_never_read() -> None:
    clock = FakeClock()
    e = llamacpp(clock, telemetry={"staleAfterSeconds": 5, "onStale": "failClosed"})
    assert e.submit("a", None, tokens(10)).state is TicketState.ADMITTED  # just started: nothing overdue
    clock.advance(5.5)  # llama-server without --metrics: the deferred queue was never read
    assert e.submit("a", None, tokens(10)).state is TicketState.QUEUED
    assert e.telemetry_age_s() is None
    vllm = Engine(admission(telemetry={"staleAfterSeconds": 5, "onStale": "failClosed"}), ModelSpec(name="m"), clock)
    clock.advance(5.5)
    assert vllm.submit("a", None, tokens(10)).reason is Reason.KV_PRESSURE  # its KV gauge never arrived
    tgi_open = Engine(admission(), ModelSpec(name="m", engine="tgi"), clock)
    clock.advance(60)
    assert tgi_open.submit("a", None, tokens(10)).state is TicketState.ADMITTED  # failOpen: unknown is not full
    generic = Engine(admission(telemetry={"onStale": "failClosed"}), ModelSpec(name="m", engine="openai"), clock)
    clock.advance(60)
    assert generic.submit("a", None, tokens(10)).state is TicketState.ADMITTED  # nothing is read from it


def test_telemetry_age_follows_the_queue_reading_where_there_is_no_kv_gauge() -> None:
    clock = FakeClock()
    e = llamacpp(clock)
    assert e.telemetry_age_s() is None
    e.observe_telemetry(Telemetry(requests_queued=0, requests_running=0))
    clock.advance(1.5)
    assert e.telemetry_age_s() == pytest.approx(1.5)
    assert e.backend_running == 0


def test_queue_signal_rules() -> None:
    s = QueueSignal()
    rules = {"max_queued": 0, "stale_after_s": 10.0, "on_stale": StalePolicy.FAIL_OPEN}
    assert not s.holding(0.0, **rules)  # never read, not expected
    s.observe(1, 0.0)
    assert s.holding(1.0, **rules)
    assert not s.holding(1.0, **{**rules, "max_queued": 1})
    assert not s.holding(10.5, **rules)  # stale, fail-open
    assert s.holding(10.5, **{**rules, "on_stale": StalePolicy.FAIL_CLOSED})
    s.observe(0, 11.0)
    assert not s.holding(11.0, **{**rules, "on_stale": StalePolicy.FAIL_CLOSED})


def test_switching_to_an_engine_without_the_signal_forgets_the_old_reading() -> None:
    clock = FakeClock()
    spec = admission(telemetry={"staleAfterSeconds": 5, "onStale": "failClosed"})
    e = Engine(spec, ModelSpec(name="m"), clock)
    e.observe_telemetry(Telemetry(kv_cache_usage=0.99, requests_queued=0))
    e.reconfigure(spec, ModelSpec(name="m", engine="openai"))  # config reloaded: nothing is read now
    clock.advance(60)
    assert e.submit("a", None, tokens(10)).state is TicketState.ADMITTED
