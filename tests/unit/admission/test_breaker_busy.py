"""The breaker's latency trip tells a sick replica from a busy one (issue #13).

A replica model with a virtual clock drives the real :class:`Engine` (and its breaker): the model
server prefills ``PREFILL_TOKENS_PER_S`` prompt tokens a second, one prompt after the other, so a
request's TTFT is the prefill work it meets when admitted (its own prompt and the prompts still
prefilling ahead of it) over that rate, plus a fixed step. Healthy, TTFT grows with load and prompt
size; sick, the same work takes ``slowdown`` times longer. The interactive class's TTFT SLO is 2 s
(the tightest), so every trip below is also over the SLO floor.
"""

from tidegate.admission.breaker import BreakerState, Completion
from tidegate.admission.cost import RequestCost
from tidegate.admission.engine import Engine
from tidegate.admission.reasons import Outcome

from .helpers import FakeClock, engine

PREFILL_TOKENS_PER_S = 2000.0
STEP_S = 0.05


def replica(clock: FakeClock) -> Engine:
    return engine(clock, tokenBudget=1_000_000, maxConcurrency=256, circuitBreaker={"minSamples": 4})


def serve(e: Engine, clock: FakeClock, prompts: list[int], slowdown: float = 1.0) -> list[float]:
    """Admit ``prompts`` at once; each gets its first token once it and the prompts ahead of it are
    prefilled; all are released. Returns the TTFTs (of those the breaker let through)."""
    admitted = []
    for prompt in prompts:
        ticket = e.submit("t", "interactive", RequestCost.fixed(prompt, 20))
        if ticket.outcome is not Outcome.REJECT:  # once open, refused: nothing to release
            admitted.append(ticket)
    ttfts, work = [], 0
    for ticket in admitted:
        work += ticket.cost.prompt_tokens
        ttfts.append(slowdown * (work / PREFILL_TOKENS_PER_S + STEP_S))
    clock.advance(max(ttfts, default=0.0))
    for ticket, ttft in zip(admitted, ttfts, strict=True):
        e.first_token(ticket, ttft)
        e.release(ticket, Completion.SUCCESS, ttft_s=ttft)
    clock.advance(1.0)
    return ttfts


def calibrated_at_light_load(clock: FakeClock) -> Engine:
    """A replica that has served short prompts (500 tokens) one at a time: TTFT 0.3 s."""
    e = replica(clock)
    for _ in range(30):
        serve(e, clock, [500])
    assert e.breaker_state is BreakerState.CLOSED
    return e


def test_a_busy_but_healthy_replica_whose_ttft_grows_with_load_stays_closed() -> None:
    """Bursts of 16 requests: the last one waits for 15 prompts ahead of it (TTFT up to 8 s, 27x
    the light-load baseline and 4x the SLO). That is load, which admission answers; a breaker
    comparing it with the light-load baseline opened and refused everyone for a cooldown."""
    clock = FakeClock()
    e = calibrated_at_light_load(clock)
    worst = 0.0
    for _ in range(40):
        worst = max(worst, *serve(e, clock, [1000] * 16))
        serve(e, clock, [500])  # light load in between, still healthy
    assert worst > 8.0
    assert e.breaker_state is BreakerState.CLOSED, e.breaker.last_trip_reason


def test_a_replica_ten_times_slower_at_light_load_still_trips() -> None:
    clock = FakeClock()
    e = calibrated_at_light_load(clock)
    for _ in range(10):
        serve(e, clock, [1000] * 16)  # it has been busy too: the busy work is calibrated as well
    assert e.breaker_state is BreakerState.CLOSED
    for _ in range(20):
        serve(e, clock, [500], slowdown=10.0)  # 3 s for what took 0.3 s, nothing else running
    assert e.breaker_state is BreakerState.OPEN
    assert "TTFT" in e.breaker.last_trip_reason


def test_a_throttled_gpu_under_load_trips() -> None:
    """The same bursts as a healthy busy replica serves, 10x slower (a GPU throttled): slow for the
    load it carries, not merely busy."""
    clock = FakeClock()
    e = calibrated_at_light_load(clock)
    for _ in range(10):
        serve(e, clock, [1000] * 16)
    assert e.breaker_state is BreakerState.CLOSED
    for _ in range(5):
        serve(e, clock, [1000] * 16, slowdown=10.0)
    assert e.breaker_state is BreakerState.OPEN
    assert "TTFT" in e.breaker.last_trip_reason


def test_a_replica_turned_slow_is_judged_on_more_work_than_it_ever_carried() -> None:
    """Slow, it keeps more prompts waiting than it ever did healthy: that work has no baseline of
    its own yet, and is judged against the light-load one scaled by the work instead of being
    learned as healthy (once learned, the slowness would pass for the norm)."""
    clock = FakeClock()
    e = calibrated_at_light_load(clock)
    for _ in range(5):
        serve(e, clock, [1000] * 16, slowdown=10.0)
    assert e.breaker_state is BreakerState.OPEN
    assert "TTFT" in e.breaker.last_trip_reason


def test_long_prompts_after_a_baseline_of_short_ones_do_not_trip() -> None:
    """16k-token prompts take 8 s to prefill on this replica: 27x the TTFT of the 500-token prompts
    it calibrated on, yet healthy (seen on a 34B model on an A100 in the simulator)."""
    clock = FakeClock()
    e = calibrated_at_light_load(clock)
    for _ in range(40):
        assert serve(e, clock, [16_000]) == [16_000 / PREFILL_TOKENS_PER_S + STEP_S]
        serve(e, clock, [500])
    assert e.breaker_state is BreakerState.CLOSED, e.breaker.last_trip_reason
    for _ in range(20):
        serve(e, clock, [16_000], slowdown=10.0)  # and once they are known, 10x slower trips
    assert e.breaker_state is BreakerState.OPEN
