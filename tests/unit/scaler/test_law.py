"""The scaling law, case by case: what a platform engineer sees in the Event text and the replica count."""

from dataclasses import dataclass

from tests.unit.scaler.helpers import hpa_replicas, obs
from tidegate.api.scaling import ScalingSpec
from tidegate.scaler import law
from tidegate.scaler.law import LawState, Observation, Reason, decide, hpa_metric_value


@dataclass(frozen=True)
class Policy(law.Policy):
    """The law's policy with the target and cooldown these cases' arithmetic is written for (the
    law is under test here, not its defaults: those are the API's, test_policy_comes_from_the_pool_spec)."""

    target_utilization: float = 0.75
    scale_down_cooldown_s: float = 300.0


WIDE = Policy(min_replicas=1, max_replicas=20)


def test_saturated_pool_sizes_from_capacity_demand_and_explains_itself() -> None:
    # 69 admitted/s by 4 replicas = 17.25/replica; demand 100/s at 75 % target -> ceil(7.73) = 8
    d, _ = decide(WIDE, obs(admitted=69, capacity=31, util=0.95), LawState(), now_s=0)
    assert (d.desired, d.reason) == (8, Reason.SATURATED)
    assert d.text == "4 -> 8: capacity reject 31% across 5 tenants"
    assert d.active and d.capacity_reject_rate == 0.31


def test_one_tenant_refused_is_said_in_the_singular() -> None:
    d, _ = decide(WIDE, obs(admitted=69, capacity=31, capacity_rejected_tenants=1), LawState(), now_s=0)
    assert d.text == "4 -> 8: capacity reject 31% across 1 tenant"


def test_step_limit_caps_one_decision_and_says_what_demand_asked() -> None:
    policy = Policy(min_replicas=1, max_replicas=20, max_scale_up_step=2)
    d, _ = decide(policy, obs(admitted=69, capacity=31), LawState(), now_s=0)
    assert d.desired == 6
    assert d.text == "4 -> 6: capacity reject 31% across 5 tenants (step-limited; demand asks 8)"


def test_ready_warm_replicas_do_not_use_up_the_step() -> None:
    d, _ = decide(WIDE, obs(admitted=10, capacity=90, warm=2), LawState(), now_s=0)
    assert d.desired == 4 + 2 + 4
    assert "(2 warm promoted first)" in d.text


def test_policy_rejections_alone_buy_nothing() -> None:
    # one tenant far over its quota: 500 policy rejections/s, no capacity rejection
    d, _ = decide(WIDE, obs(admitted=100, policy=500), LawState(), now_s=0)
    assert (d.desired, d.reason) == (4, Reason.STEADY)
    assert d.policy_reject_rate is not None and d.policy_reject_rate > 0.8


def test_capacity_rejections_below_target_rate_do_not_scale_out() -> None:
    d, _ = decide(WIDE, obs(admitted=100, capacity=1), LawState(), now_s=0)  # 1 % < 2 %
    assert d.desired == 4


def test_high_token_utilisation_scales_out_before_anything_is_refused() -> None:
    # the first reading over the band waits for the next one (WIDE: 7.5 s, half a 15 s poll)
    d, state = decide(WIDE, obs(util=0.95), LawState(), now_s=0)
    assert (d.desired, d.reason) == (4, Reason.STEADY)
    assert d.text.endswith("; utilisation over the band for 0 s: acts once it lasts 7.5 s")
    d, _ = decide(WIDE, obs(util=0.95), state, now_s=15)
    assert (d.desired, d.reason) == (6, Reason.UTILIZATION)  # ceil(0.95 * 4 / 0.75)
    assert d.text == "4 -> 6: token utilisation 95% over target 75%"


def test_one_reading_over_the_band_buys_nothing_and_teaches_no_knee() -> None:
    # diurnal, simulator seed 2: utilisation read 51%, 104%, 12% on three polls; the 104% bought a
    # replica and its knee (A / n of a pool that refused nothing) held it for 35 minutes
    policy = Policy(min_replicas=1, max_replicas=20, target_utilization=0.85)
    state = LawState()
    for t, u in ((0, 0.51), (15, 1.04), (30, 0.12)):
        d, state = decide(policy, obs(active=1, admitted=2, util=u), state, now_s=t)
        assert d.desired == 1, (t, d.text)
    assert state.knees == () and state.over_band_since_s is None
    # capacity refusals act on the first reading: users are being turned away
    d, _ = decide(policy, obs(active=1, admitted=2, capacity=1, util=1.04), LawState(), now_s=0)
    assert (d.desired, d.reason) == (2, Reason.SATURATED)  # ceil(3 / 2 / 0.85)


def test_scale_down_waits_for_a_whole_cooldown_of_lower_demand() -> None:
    policy = Policy(min_replicas=1, max_replicas=20, scale_down_cooldown_s=300)
    low = obs(active=6, util=0.3)  # fits ceil(0.3 * 6 / 0.75) = 3
    state = LawState()
    d, state = decide(policy, low, state, now_s=0)
    assert (d.desired, d.reason) == (6, Reason.COOLDOWN)
    d, state = decide(policy, low, state, now_s=150)
    assert d.desired == 6
    assert d.text == "6 -> 6: demand fits 3; holding for the scale-down cooldown (150 s of 300 s)"
    d, state = decide(policy, low, state, now_s=300)
    assert (d.desired, d.reason) == (3, Reason.SCALE_DOWN)
    assert d.text == "6 -> 3: utilisation 30% under target 75% for 300 s"


def test_a_spike_inside_the_cooldown_restarts_it() -> None:
    policy = Policy(min_replicas=1, max_replicas=20, scale_down_cooldown_s=300)
    state = LawState()
    _, state = decide(policy, obs(active=6, util=0.3), state, now_s=0)
    _, state = decide(policy, obs(active=6, util=0.75), state, now_s=200)  # busy again for one poll
    d, state = decide(policy, obs(active=6, util=0.3), state, now_s=400)
    assert d.desired == 6
    d, _ = decide(policy, obs(active=6, util=0.3), state, now_s=501)
    assert d.desired == 3


def test_stale_pods_never_scale_down_and_the_text_names_them() -> None:
    policy = Policy(min_replicas=1, max_replicas=20, scale_down_cooldown_s=0)
    o = obs(active=4, util=0.1, reporting=3, fresh=3, stale=("small-3",))
    d, _ = decide(policy, o, LawState(), now_s=0)
    assert (d.desired, d.reason) == (4, Reason.HOLD_STALE)
    assert "no fresh stats from 1 pod(s) in the Service (small-3)" in d.text
    assert d.active


def test_stale_pods_do_not_stop_a_scale_up_the_others_prove() -> None:
    o = obs(active=4, admitted=69, capacity=31, reporting=3, fresh=3, stale=("small-3",))
    d, _ = decide(WIDE, o, LawState(), now_s=0)
    assert d.desired > 4


def test_no_stats_at_all_holds_and_stays_active() -> None:
    o = obs(active=4, reporting=0, fresh=0, stale=("a", "b", "c", "d"), in_flight_tokens=0, token_budget=0)
    d, _ = decide(Policy(scale_down_cooldown_s=0), o, LawState(), now_s=0)
    assert (d.desired, d.reason, d.active) == (4, Reason.HOLD_STALE, True)
    assert d.text == "4 -> 4: holding: no fresh stats from 4 pod(s) in the Service (a, b, c, ...)"


def test_first_sample_has_no_rate_so_it_holds() -> None:
    d, _ = decide(WIDE, obs(window_s=0.0, util=0.1), LawState(), now_s=0)
    assert (d.desired, d.reason) == (4, Reason.HOLD_WARMUP)
    assert d.active


def test_idle_pool_goes_to_min_after_the_cooldown_and_only_its_last_replica_is_inactive() -> None:
    policy = Policy(min_replicas=0, max_replicas=8, scale_down_cooldown_s=60)
    idle = obs(active=2, admitted=0, util=0.0)
    d, state = decide(policy, idle, LawState(), now_s=0)
    # KEDA would take 2 -> 0 at once after its cooldownPeriod: the HPA takes it to 1 first, in steps
    assert d.desired == 2 and d.active is True
    d, _ = decide(policy, idle, state, now_s=60)
    assert (d.desired, d.reason) == (0, Reason.IDLE)
    d, _ = decide(policy, obs(active=1, admitted=0, util=0.0), LawState(), now_s=0)
    assert d.active is False  # KEDA decides 1 -> 0 with its own cooldownPeriod


def test_replicas_still_starting_keep_the_pool_active() -> None:
    d, _ = decide(Policy(min_replicas=0), obs(active=1, admitted=0, util=0.0, starting=1), LawState(), now_s=0)
    assert d.active


def test_a_replica_loading_before_any_is_active_keeps_the_pool_active() -> None:
    loading = Observation(active=0, loading=1)
    d, _ = decide(Policy(min_replicas=0), loading, LawState(), now_s=0)
    assert d.active and d.reason is Reason.HOLD_WARMUP
    assert "1 replica(s) loading" in d.text
    d, _ = decide(Policy(min_replicas=0), Observation(active=0), LawState(), now_s=0)
    assert not d.active


def test_saturated_pool_with_replicas_starting_does_not_double_count() -> None:
    # 6 active, 2 of them still loading the model: the 4 serving ones say 6 are enough
    o = obs(active=6, admitted=80, capacity=20, reporting=4, fresh=4, starting=2, util=0.5)
    d, _ = decide(Policy(min_replicas=1, max_replicas=20, target_utilization=1.0), o, LawState(), now_s=0)
    assert (d.desired, d.reason) == (6, Reason.STEADY)
    assert "(2 starting)" in d.text


def test_bounds_are_enforced_and_explained() -> None:
    d, _ = decide(Policy(max_replicas=8), obs(active=12, util=0.75), LawState(), now_s=0)
    assert (d.desired, d.reason, d.text) == (8, Reason.BOUNDS, "12 -> 8: above maxReplicas 8")
    d, _ = decide(Policy(min_replicas=2), obs(active=0, reporting=0, fresh=0), LawState(), now_s=0)
    assert (d.desired, d.text) == (2, "0 -> 2: below minReplicas 2")


def test_hpa_tolerance_cannot_park_a_saturated_pool() -> None:
    policy = Policy(min_replicas=1, max_replicas=40, target_utilization=0.95)
    # 10 replicas admit 100/s and refuse 3/s: ceil(103 / (10 * 0.95)) = 11
    d, _ = decide(policy, obs(active=10, admitted=100, capacity=3), LawState(), now_s=0)
    assert d.desired == 11
    assert hpa_replicas(10, 11.0, 1, 40) == 10  # the trap: 11/10 is within the HPA's 10 %
    assert d.metric_value == 12.0
    assert hpa_replicas(10, d.metric_value, 1, 40) == 12


def test_metric_value_lands_the_hpa_exactly_when_outside_its_tolerance() -> None:
    for current, desired in [(4, 8), (4, 5), (10, 13), (10, 4), (3, 3)]:
        assert hpa_metric_value(desired, current) == float(desired)
        if desired != current:
            assert hpa_replicas(current, float(desired), 1, 100) == desired


def test_policy_comes_from_the_pool_spec() -> None:
    spec = ScalingSpec.model_validate({"minReplicas": 2, "maxReplicas": 9, "scaleDownCooldownSeconds": 30})
    p = law.Policy.from_spec(spec)
    assert (p.min_replicas, p.max_replicas, p.scale_down_cooldown_s, p.target_utilization) == (2, 9, 30.0, 0.85)
    assert law.Policy() == law.Policy.from_spec(ScalingSpec())  # the law's defaults are the API's


def test_nothing_admitted_at_all_takes_a_full_step() -> None:
    # every request refused for capacity (e.g. every breaker open): no per-replica capacity to divide by
    d, _ = decide(WIDE, obs(admitted=0, capacity=50), LawState(), now_s=0)
    assert (d.desired, d.reason) == (8, Reason.SATURATED)
    assert "step-limited; demand asks 20" in d.text


def test_a_pool_whose_congestion_clears_after_a_scale_up_does_not_scale_back_down() -> None:
    # Little's law: 1 replica congested at 4 req/s holds 97 % of its budget in flight; on 2 replicas the
    # same 4 req/s hold 4 %. In-flight tokens alone say "fits 1" (1 -> 2 -> 1 -> 2 ...); the
    # admitted rate seen when the replica was full (4/s) says 4/s needs 2 at the 75 % target.
    policy = Policy(min_replicas=1, max_replicas=8, scale_down_cooldown_s=300)
    _, state = decide(policy, obs(active=1, admitted=4, util=0.97), LawState(), now_s=-15)
    d, state = decide(policy, obs(active=1, admitted=4, util=0.97), state, now_s=0)  # sustained
    assert (d.desired, d.reason) == (2, Reason.UTILIZATION)
    for t in range(15, 1200, 15):
        d, state = decide(policy, obs(active=2, admitted=4, util=0.04), state, now_s=t)
        assert (d.desired, d.reason) == (2, Reason.STEADY), d.text
    assert d.text == "2 -> 2: steady (capacity reject 0%, utilisation 4%); demand 4/s needs 2 at the 75% target"


def test_a_pool_remembers_its_knee_but_still_scales_down_when_demand_falls() -> None:
    policy = Policy(min_replicas=1, max_replicas=8, scale_down_cooldown_s=300)
    # saturated at 2 replicas admitting 3/s each: capacity 3/s per replica
    _, state = decide(policy, obs(active=2, admitted=6, capacity=3, util=0.95), LawState(), now_s=0)
    _, state = decide(policy, obs(active=4, admitted=9, util=0.3), state, now_s=15)
    d, state = decide(policy, obs(active=4, admitted=4, util=0.05), state, now_s=400)
    # 4/s over 3/s per replica at 75 % -> ceil(1.78) = 2, not the 1 the in-flight tokens say
    assert (d.desired, d.reason) == (2, Reason.SCALE_DOWN)
    d, _ = decide(policy, obs(active=2, admitted=1, util=0.02), state, now_s=800)
    assert (d.desired, d.reason) == (1, Reason.SCALE_DOWN)


def test_the_throughput_need_counts_the_warm_replicas_that_serve() -> None:
    # the knee is what a replica in the Service admits: 2 active + 1 serving warm full at 9/s, 3/s each
    policy = Policy(min_replicas=1, max_replicas=20, scale_down_cooldown_s=300)
    full = obs(active=2, admitted=9, capacity=3, util=0.95, reporting=3, warm=1, warm_serving=1)
    _, state = decide(policy, full, LawState(), now_s=0)
    # scaled out to 5 active + 1 serving warm, demand back to 9/s: 9 / (3 x 0.75) = 4 replicas in the
    # Service, 1 of them the warm one, so 3 active; holding 4 active kept the warm one on top, unused
    for t in range(15, 600, 15):
        later = obs(active=5, admitted=9, util=0.1, reporting=6, warm=1, warm_serving=1)
        d, state = decide(policy, later, state, now_s=t)
    assert (d.desired, d.reason) == (3, Reason.SCALE_DOWN), d.text
    d, _ = decide(policy, obs(active=3, admitted=9, util=0.2, reporting=4, warm=1, warm_serving=1), state, now_s=615)
    assert d.text.endswith("demand 9/s needs 3 at the 75% target beside 1 serving warm")


def test_the_warm_replicas_share_of_the_need_is_not_taken_where_the_active_ones_would_read_over_target() -> None:
    # 2 active + 1 serving warm, the knee 10/s per replica, 15/s now: 2 replicas in the Service carry it,
    # so 1 active beside the warm one; but utilisation divides all three replicas' tokens by the active
    # ones, and in-flight tokens grow steeply with load: at 1 active + 1 warm the 37 % read at 2 + 1
    # becomes 0.37 x 2/1 x (3/2)**3 = 250 %, over the band: the warm one promoted, a new one loading, and
    # the floor dropping again (a flap). The floor keeps 2 there, and takes the warm share where it fits.
    policy = Policy(min_replicas=1, max_replicas=20, scale_down_cooldown_s=300)
    knee = obs(active=2, admitted=30, capacity=10, util=0.95, reporting=3, warm=1, warm_serving=1)
    _, state = decide(policy, knee, LawState(), now_s=0)
    for t in range(15, 600, 15):
        d, state = decide(
            policy, obs(active=2, admitted=15, util=0.37, reporting=3, warm=1, warm_serving=1), state, now_s=t
        )
    assert (d.desired, d.reason) == (2, Reason.STEADY), d.text
    for t in range(600, 1200, 15):  # 0.1 x 2/1 x (3/2)**3 = 68 %: under the 75 % target
        d, state = decide(
            policy, obs(active=2, admitted=15, util=0.1, reporting=3, warm=1, warm_serving=1), state, now_s=t
        )
    assert (d.desired, d.reason) == (1, Reason.SCALE_DOWN), d.text


def test_a_rate_seen_while_replicas_start_is_no_measure_of_capacity() -> None:
    policy = Policy(min_replicas=1, max_replicas=8, scale_down_cooldown_s=0)
    # saturated while 2 of 4 replicas are still loading: 2/s per serving replica is not a knee
    _, state = decide(policy, obs(active=4, admitted=4, capacity=8, reporting=2, starting=2), LawState(), now_s=0)
    d, _ = decide(policy, obs(active=4, admitted=4, util=0.05), state, now_s=15)
    assert d.desired == 1


def test_a_pool_whose_admission_collapses_under_overload_is_sized_from_what_its_replicas_served_before() -> None:
    policy = Policy(min_replicas=1, max_replicas=20, max_scale_up_step=4)
    # 2 replicas full at 3/s each, 3/s refused: 9/s at 3/s per replica at 75 % -> 4
    d, state = decide(policy, obs(active=2, admitted=6, capacity=3, util=0.95), LawState(), now_s=0)
    assert d.desired == 4
    # demand 15/s, but the overloaded replicas now admit 0.5/s each: the current rate alone says 40
    d, _ = decide(policy, obs(active=2, admitted=1, capacity=14, util=0.95), state, now_s=15)
    assert d.text == "2 -> 6: capacity reject 93% across 5 tenants (step-limited; demand asks 7)"


def test_a_hold_keeps_the_replicas_still_on_their_way() -> None:
    # Seen with the real HPA (np/lim): spec.replicas 3, two active, the third replica's pod Pending at
    # the NodePool's GPU limit (warm-labelled, not Ready, beyond the warm pool: loading), no stats.
    # Holding at the 2 active ones made the HPA drop the third replica on missing data (3 -> 2).
    waiting = Observation(active=2, loading=1, stale=("lim-a", "lim-b"))
    d, _ = decide(WIDE, waiting, LawState(), now_s=0)
    assert (d.desired, d.reason) == (3, Reason.HOLD_STALE)
    assert hpa_replicas(current=3, metric=d.metric_value, lo=1, hi=20) == 3
    assert "1 replica(s) still loading" in d.text
    # the same with stats from one pod that say demand fits 1: stale data still never scales down
    o = obs(active=2, util=0.1, reporting=1, fresh=1, stale=("lim-b",), loading=1)
    d, _ = decide(Policy(min_replicas=1, max_replicas=20, scale_down_cooldown_s=0), o, LawState(), now_s=0)
    assert (d.desired, d.reason) == (3, Reason.HOLD_STALE)
    # at 10 active + 1 loading, the hold must not be nudged past the HPA's tolerance into a scale-up
    d, _ = decide(WIDE, Observation(active=10, loading=1, stale=("p",)), LawState(), now_s=0)
    assert hpa_replicas(current=11, metric=d.metric_value, lo=1, hi=20) == 11


def test_a_pool_whose_requests_grew_since_its_knee_still_scales_out() -> None:
    # knee: 4 replicas admitting 10/s each while refusing 4/s -> c = 10/s per replica, 44/s needs 6
    d, state = decide(WIDE, obs(active=4, admitted=40, capacity=4, util=0.95), LawState(), now_s=0)
    assert d.desired == 6
    # 20 min later the prompts are twice as long: 6 replicas admit 5/s each and refuse 10/s (25 %) at
    # 75 % of their token budget (the concurrency cap or the TTFT deadline binds first). By the
    # remembered 10/s, 40/s "fits" 6 replicas (the law said so, and held, for up to an hour); the
    # refusals say otherwise: 40 / (5 * 0.75) -> 11
    d, state = decide(WIDE, obs(active=6, admitted=30, capacity=10, util=0.75), state, now_s=1200)
    assert (d.desired, d.reason) == (10, Reason.SATURATED), d.text
    assert d.text == "6 -> 10: capacity reject 25% across 5 tenants (step-limited; demand asks 11)"
    # and the old knee is forgotten: the scale-down floor is sized from the new 5/s per replica
    assert max(c for _, c in state.knees) == 5
