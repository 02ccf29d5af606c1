"""What the simulator found in tidegate itself, and the test that keeps it fixed.

During a spike the scaling law sizes from ``obs.active`` (pods labelled active), but the HPA's
current count is ``spec.replicas``: replicas still loading are labelled ``warm`` by the operator,
so the law neither counts them as active nor as starting, and answers a number below
``spec.replicas``. With no scale-down stabilisation window in the operator's ScaledObject the HPA
followed it down while the pool was still saturated, then back up: flaps. The law now counts the
pool's scale-down cooldown itself and the ScaledObject keeps a one-minute window on top (it kept the
HPA's 300 s at first, which made every scale-down wait both); the pool may step down late in the
spike once the law's cooldown has passed, but never scales down and back up while the spike lasts.
"""

import dataclasses
from typing import Any

import pytest

from tests.unit.simulate.conftest import BASE
from tidegate.admission.breaker import BreakerState
from tidegate.sim.simulate import core, policies, report, scenario

SPIKE = {**BASE, "faults": [], "duration_s": 420, "load": {"spikes": [{"start_s": 60, "end_s": 360, "factor": 4}]}}


def _up_after_down_during_spike(policy: str, seed: int) -> list[core.ScaleAction]:
    sim = core.Simulator(scenario.parse(SPIKE), policies.make(policy), seed=seed).run()
    during = [a for a in sim.actions if 60 <= a.time_s < 360]
    first_down = next((i for i, a in enumerate(during) if a.after < a.before), len(during))
    return [a for a in during[first_down:] if a.after > a.before]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_tidegate_never_scales_down_and_back_up_while_the_spike_lasts(seed: int) -> None:
    assert _up_after_down_during_spike("tidegate", seed) == []


def test_with_the_hpa_default_window_it_does_not() -> None:
    assert _up_after_down_during_spike("tidegate-hpa300", 1) == []


def test_a_pool_whose_congestion_clears_after_scaling_up_does_not_flap() -> None:
    """diurnal, seed 0: in-flight tokens are super-linear in congestion (387k on 1 replica, 34k on 2
    a poll later), so sizing by them alone took the pool 1 -> 2 -> 1 (5 flaps); the law now holds
    the throughput the replicas served at their knee."""
    sim = core.Simulator(scenario.load("diurnal"), policies.make("tidegate"), seed=0).run()
    assert report.summarize(sim).flaps == 0


def test_a_replica_turned_slow_is_cut_off_at_its_first_slow_tokens_not_when_its_long_answers_end() -> None:
    """mixed-34b-a100 (long generations), seed 0: one serving replica runs 10x slower (prefill and
    decode) from 600 s. Its breaker used to learn TTFT when each request ended, and opened at 957 s;
    the engine now hears each first token when the replica produces it (the proxy's first streamed
    event), and it opens within the first minute. No healthy replica's breaker opens."""
    sim = core.Simulator(scenario.load("mixed-34b-a100"), policies.make("tidegate"), seed=0)
    slow: list[Any] = []
    opened: dict[str, float] = {}

    def slow_down(_: object) -> None:
        pod = sorted(sim.pool.serving(), key=lambda p: p.name)[0]
        c = pod.replica.config
        pod.replica.config = dataclasses.replace(
            c, prefill_tokens_per_s=c.prefill_tokens_per_s / 10, decode_tokens_per_s=c.decode_tokens_per_s / 10
        )
        slow.append(pod)

    def watch(_: object) -> None:
        for pod in sim.pool.serving():
            if pod.front is not None and pod.front.breaker_state is BreakerState.OPEN:
                opened.setdefault(pod.name, sim.now)
        sim.schedule(sim.now + 1.0, "watch")

    sim._on_slow_down, sim._on_watch = slow_down, watch  # type: ignore[attr-defined]
    sim.schedule(600.0, "slow_down")
    sim.schedule(1.0, "watch")
    sim.run()
    assert list(opened) == [slow[0].name], opened
    assert opened[slow[0].name] < 660.0, opened


def test_the_poll_a_replica_joins_does_not_buy_another() -> None:
    """spike, seed 0: 15 req/s arrive in the burst. The scaler summed each pod's own rate, so the
    poll a fourth replica joined counted the requests it had taken twice (its rate over its first
    seconds, and the older replicas' rates over a window from before it took its share): 18.8/s of
    demand, and a sixth active replica bought for a burst five serve. The pool's rates now cover one
    window (``rates.observe``), and the pool peaks at five active replicas."""
    from tidegate.scaler import law

    seen: list[tuple[float, float, int]] = []
    real_decide = law.decide

    def decide(policy, obs, state, now_s):
        if obs.reporting:
            seen.append((now_s, obs.demand_per_s, obs.reporting))
        return real_decide(policy, obs, state, now_s)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(law, "decide", decide)
        sim = core.Simulator(scenario.load("spike"), policies.make("tidegate"), seed=0).run()
    in_burst = [d for t, d, _ in seen if 700 <= t < 1200]
    assert max(in_burst) < 15 * 1.15, max(in_burst)  # what arrives, give or take the window's noise
    assert max(a.after for a in sim.actions) == 5
