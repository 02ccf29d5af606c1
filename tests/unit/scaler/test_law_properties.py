"""Invariants of the scaling law over generated inputs (hypothesis)."""

import random

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.unit.scaler.helpers import hpa_replicas, obs
from tidegate.scaler.law import LawState, Policy, decide

policies = st.builds(
    Policy,
    min_replicas=st.integers(0, 4),
    max_replicas=st.integers(4, 64),
    target_capacity_reject_rate=st.floats(0.0, 0.2),
    target_utilization=st.floats(0.3, 1.0),
    max_scale_up_step=st.integers(1, 8),
    scale_down_cooldown_s=st.sampled_from([0.0, 60.0, 300.0]),
)
actives = st.integers(0, 80)
rates = st.floats(0.0, 1000.0)
utils = st.floats(0.0, 1.5)


@st.composite
def states(draw: st.DrawFn) -> LawState:
    """A history the law might have: when it started watching, and earlier recommendations."""
    first = draw(st.sampled_from([None, -1000.0, -100.0, 0.0]))
    recs = draw(st.lists(st.tuples(st.floats(-400, 0), st.integers(0, 64)), max_size=5))
    return LawState(first_s=first, recommendations=tuple(sorted(recs)))


@given(policies, actives, rates, rates, rates, utils, states())
def test_desired_is_monotonic_in_capacity_rejections(p, n, admitted, c1, c2, util, state) -> None:
    lo, hi = sorted((c1, c2))
    d_lo, _ = decide(p, obs(active=n, admitted=admitted, capacity=lo, util=util), state, now_s=0)
    d_hi, _ = decide(p, obs(active=n, admitted=admitted, capacity=hi, util=util), state, now_s=0)
    assert d_lo.desired <= d_hi.desired


@given(policies, actives, rates, rates, rates, utils, states())
def test_policy_rejections_never_change_desired(p, n, admitted, capacity, policy_rej, util, state) -> None:
    base, _ = decide(p, obs(active=n, admitted=admitted, capacity=capacity, util=util), state, now_s=0)
    more, _ = decide(
        p, obs(active=n, admitted=admitted, capacity=capacity, policy=policy_rej, util=util), state, now_s=0
    )
    assert more.desired == base.desired


@given(policies, actives, rates, rates, utils, st.integers(0, 8), st.booleans(), states())
def test_desired_is_always_within_bounds(p, n, admitted, capacity, util, warm, stale, state) -> None:
    o = obs(active=n, admitted=admitted, capacity=capacity, util=util, warm=warm, stale=("x",) if stale else ())
    d, _ = decide(p, o, state, now_s=0)
    assert p.min_replicas <= d.desired <= p.max_replicas
    assert d.desired <= max(n, p.min_replicas) + warm + p.max_scale_up_step  # the step limit


@given(policies, st.integers(1, 63), st.floats(1.0, 1000.0), st.floats(0.01, 1000.0), utils)
def test_hpa_tolerance_never_parks_a_pool_the_law_grows(p, n, admitted, capacity, util) -> None:
    d, _ = decide(p, obs(active=n, admitted=admitted, capacity=capacity, util=util), LawState(), now_s=0)
    if d.desired > n:
        assert hpa_replicas(n, d.metric_value, p.min_replicas, p.max_replicas) >= d.desired


@settings(max_examples=50)
@given(
    st.integers(2, 30),  # replicas the pool runs at
    st.floats(0.0, 0.12),  # noise amplitude on utilisation, relative (the dead band is 0.15)
    st.floats(0.0, 0.015),  # capacity reject rate, below the 2 % target
    st.integers(0, 2**32 - 1),
)
def test_noisy_steady_load_never_changes_the_count(n, noise, reject_rate, seed) -> None:
    rng = random.Random(seed)
    p = Policy(min_replicas=1, max_replicas=64, scale_down_cooldown_s=300)
    state, current = LawState(), n
    for tick in range(100):  # 100 polls, 15 s apart
        admitted = 50.0 * n * (1 + rng.uniform(-0.3, 0.3))
        util = 0.75 * (1 + rng.uniform(-noise, noise))
        o = obs(active=current, admitted=admitted, capacity=admitted * reject_rate, util=util)
        d, state = decide(p, o, state, now_s=tick * 15.0)
        assert d.desired == n, d.text
        current = hpa_replicas(current, d.metric_value, p.min_replicas, p.max_replicas)


@settings(max_examples=100)
@given(
    st.lists(st.tuples(rates, rates, utils, st.booleans()), min_size=2, max_size=40),
    st.sampled_from([60.0, 300.0]),
)
# found by hypothesis: a knee at a denormal admitted rate made the throughput need inf (OverflowError)
@example(steps=[(2.2250738585072014e-308, 0.0, 1.0, False), (1.0, 0.0, 0.0, False)], cooldown=60.0)
def test_never_scales_down_within_a_cooldown_of_scaling_up(steps, cooldown) -> None:
    # any sequence of inputs, polled every 15 s, with the HPA applying each answer
    p = Policy(min_replicas=1, max_replicas=64, scale_down_cooldown_s=cooldown)
    state, current, last_up = LawState(), 4, None
    for tick, (admitted, capacity, util, stale) in enumerate(steps):
        now = tick * 15.0
        o = obs(active=current, admitted=admitted, capacity=capacity, util=util, stale=("x",) if stale else ())
        d, state = decide(p, o, state, now_s=now)
        if d.desired > current:
            last_up = now
        if d.desired < current and last_up is not None:
            assert now - last_up >= cooldown, d.text
        current = d.desired
