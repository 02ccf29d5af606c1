"""Counter deltas and pool observations from sidecar snapshots: resets, pods coming and going, staleness."""

from tidegate.admission.reasons import Reason
from tidegate.admission.stats import StatsSnapshot, TenantCounters
from tidegate.scaler import law
from tidegate.scaler.pods import PodInfo
from tidegate.scaler.rates import Sample, SampleHistory, observe, pod_delta


def snap(*args: object, **kw: object) -> Sample:
    """A :class:`Sample` of :func:`snapshot`."""
    return Sample.of(snapshot(*args, **kw))  # type: ignore[arg-type]


def snapshot(
    t: float,
    admitted: int = 0,
    queue_full: int = 0,
    tenant_rate: int = 0,
    instance: str = "i1",
    started: float = 0.0,
    pod: str = "p0",
    **kw: object,
) -> StatsSnapshot:
    tenants = {"acme": TenantCounters(admitted=admitted, capacity_rejected=queue_full, policy_rejected=tenant_rate)}
    return StatsSnapshot(
        pod=pod,
        instance_id=instance,
        started_at_s=started,
        time_s=t,
        admitted_total=admitted,
        rejected_total={Reason.QUEUE_FULL: queue_full, Reason.TENANT_RATE: tenant_rate},
        tenants=tenants,
        **kw,
    )


def test_delta_between_two_snapshots_of_one_process() -> None:
    d = pod_delta(snap(100, admitted=10, queue_full=1), snap(160, admitted=70, queue_full=7, tenant_rate=3), 120)
    assert d is not None
    assert (d.window_s, d.admitted, d.capacity_rejected, d.policy_rejected) == (60, 60, 6, 3)
    assert d.capacity_rejected_tenants == {"acme"} and not d.reset


def test_restarted_sidecar_is_counted_from_its_start_not_as_negative_demand() -> None:
    before = snap(100, admitted=5000, queue_full=900, instance="old")
    after = snap(160, admitted=40, queue_full=2, instance="new", started=130)
    d = pod_delta(before, after, 120)
    assert d is not None and d.reset
    assert (d.window_s, d.admitted, d.capacity_rejected) == (30, 40, 2)


def test_counter_going_down_without_new_instance_is_treated_as_a_reset() -> None:
    d = pod_delta(snap(100, admitted=500), snap(160, admitted=20, started=150), 120)
    assert d is not None and d.reset and d.admitted == 20


def test_new_pod_counts_from_its_start_but_an_old_unknown_pod_waits() -> None:
    young = pod_delta(None, snap(160, admitted=30, started=100), max_window_s=120)
    assert young is not None and (young.window_s, young.admitted) == (60, 30)
    assert pod_delta(None, snap(10_000, admitted=30, started=100), max_window_s=120) is None


def test_same_document_twice_has_no_rate() -> None:
    assert pod_delta(snap(100, admitted=1), snap(100, admitted=1), 120) is None


def test_history_picks_the_newest_snapshot_a_whole_window_back() -> None:
    h = SampleHistory(keep_s=300)
    for t in (0, 15, 30, 45, 60, 75):
        h.record("p0", snap(t))
    base = h.baseline("p0", snap(90), window_s=60)
    assert base is not None and base.time_s == 30
    young = h.baseline("p0", snap(20), window_s=60)  # not a whole window yet: the oldest there is
    assert young is not None and young.time_s == 0
    assert h.baseline("other", snap(90), 60) is None


def test_history_is_bounded_and_forgets_pods_that_left() -> None:
    h = SampleHistory(keep_s=100)
    for t in range(0, 1000, 10):
        h.record("p0", snap(t))
        if t <= 200:
            h.record("gone", snap(t))
        h.prune(["p0", "gone"] if t <= 200 else ["p0"], now_s=t)
    assert len(h) <= 12 and h.pods == 1
    assert h.baseline("gone", snap(1000), 60) is None
    assert h.baseline("p0", snap(1000), 60) is not None


def test_observation_sums_active_pods_and_separates_stale_from_starting() -> None:
    pods = [
        PodInfo("a", "http://a"),
        PodInfo("b", "http://b"),
        PodInfo("c", "http://c"),  # ready, but its stats are 100 s old
        PodInfo("d", "http://d", ready=False),  # loading the model
        PodInfo("w", "http://w", role="warm"),
        PodInfo("x", "http://x", role="draining"),
    ]
    common = {"in_flight_tokens": 500, "token_budget": 1000, "queue_depth": 2}
    current = {
        "a": snap(160, admitted=70, queue_full=10, **common),
        "b": snap(160, admitted=40, tenant_rate=30, **common),
        "c": snap(60, admitted=1, **common),
        "w": snap(160, tenant_rate=99),
        "x": snap(160, admitted=500),
    }
    baselines = {"a": snap(100, admitted=10, queue_full=4), "b": snap(100, admitted=10)}
    o = observe(pods, current, baselines, now_s=161, stale_after_s=45, max_window_s=120)
    assert (o.active, o.starting, o.warm, o.reporting, o.fresh, o.stale) == (4, 1, 1, 2, 2, ("c",))
    assert o.admitted_per_s == (60 + 30) / 60
    assert o.capacity_rejected_per_s == 6 / 60
    assert o.policy_rejected_per_s == 30 / 60
    assert o.capacity_rejected_tenants == 1
    assert (o.in_flight_tokens, o.token_budget, o.queue_depth) == (1000, 2000, 4)


def test_history_stays_small_however_often_it_is_polled() -> None:
    h = SampleHistory(keep_s=120, min_spacing_s=7.5)
    for i in range(2400):  # every 0.1 s for 4 minutes
        h.record("p0", snap(i / 10))
    assert len(h) <= 17
    base = h.baseline("p0", snap(240.0), window_s=60)
    assert base is not None and 172.5 <= base.time_s <= 180


def test_documents_with_non_finite_times_or_absurd_counters_are_broken_pods() -> None:
    import math

    import pydantic
    import pytest

    for bad in ({"time_s": math.nan}, {"time_s": math.inf}, {"admitted_total": 10**400}, {"in_flight_tokens": 10**40}):
        fields = {"instance_id": "i", "started_at_s": 0.0, "time_s": 1.0, **bad}
        with pytest.raises(pydantic.ValidationError):
            StatsSnapshot.model_validate(fields)


def test_a_pod_whose_clock_is_far_ahead_or_whose_stats_froze_is_stale_not_idle() -> None:
    pods = [PodInfo("a", role="active", ready=True), PodInfo("b", role="active", ready=True)]
    now = 1000.0
    base = {"a": snap(940, admitted=10, pod="a"), "b": snap(940, admitted=10, pod="b")}
    future = {"a": snap(1000, admitted=20, pod="a"), "b": snap(now + 1e6, admitted=20, pod="b")}
    assert observe(pods, future, base, now_s=now, stale_after_s=45, max_window_s=120).stale == ("b",)
    frozen = {"a": snap(1000, admitted=20, pod="a"), "b": snap(940, admitted=10, pod="b")}  # same document again
    assert observe(pods, frozen, base, now_s=now - 30, stale_after_s=45, max_window_s=120).stale == ("b",)


def test_a_pool_whose_only_replica_is_loading_has_one_loading_and_none_active() -> None:
    # spec.replicas 1, warmPool 0: the Deployment's one pod is labelled warm until Ready (then promoted).
    obs = observe([PodInfo("p0", role="warm", ready=False, ip="10.0.0.1")], {}, {}, 100.0, 30.0, 600.0, 0)
    assert (obs.active, obs.starting, obs.loading, obs.warm) == (0, 0, 1, 0)


def test_pods_refilling_the_warm_pool_are_not_loading_to_serve() -> None:
    refill = [PodInfo("w0", role="warm", ready=False), PodInfo("w1", role="warm", ready=True)]
    assert observe(refill, {}, {}, 100.0, 30.0, 600.0, warm_pool_size=2).loading == 0
    # one place beyond the warm pool of 1: the not-ready pod is the one on its way to serve
    assert observe(refill, {}, {}, 100.0, 30.0, 600.0, warm_pool_size=1).loading == 1
    # a trigger written without warmPoolSize: unknown, counted as before (none)
    assert observe(refill, {}, {}, 100.0, 30.0, 600.0).loading == 0


def test_a_replica_still_sizing_itself_holds_an_unknown_budget_not_zero() -> None:
    # a sidecar reading its capacity from the model server reports a null budget (token_budget_source
    # "pending"); the pool's utilisation is the sized replica's, as if the other held as much
    pending = StatsSnapshot.model_validate_json(snapshot(160, pod="b", token_budget_source="pending").model_dump_json())
    assert (pending.token_budget, pending.max_concurrency) == (None, None)
    pods = [PodInfo("a", "http://a"), PodInfo("b", "http://b", ready=False)]
    current = {
        "a": snap(160, admitted=70, in_flight_tokens=800, token_budget=1000),
        "b": Sample.of(pending),
    }
    o = observe(pods, current, {}, now_s=161, stale_after_s=45, max_window_s=120)
    assert (o.active, o.starting, o.fresh, o.token_budget) == (2, 1, 1, 1000)
    assert o.utilization == 800 / (2 * 1000)
    everyone_pending = observe(pods, {"b": Sample.of(pending)}, {}, now_s=161, stale_after_s=45, max_window_s=120)
    assert everyone_pending.utilization is None  # unknown, not infinitely full nor empty


def test_a_serving_warm_pods_load_sizes_the_active_replicas_beneath_it() -> None:
    # spec.warmPool.serve: the warm pod "w" is in the Service and carries half the load; "idle" is a
    # warm pod out of the Service (its stats, if any, say nothing about the pool's load); "loading"
    # is labelled serving but not Ready yet, so the Service sends it nothing
    pods = [
        PodInfo("a"),
        PodInfo("w", role="warm", serving=True),
        PodInfo("idle", role="warm"),
        PodInfo("loading", role="warm", serving=True, ready=False),
    ]
    names = [p.name for p in pods]
    current = {n: snap(160, admitted=70, in_flight_tokens=600, token_budget=1000, queue_depth=1, pod=n) for n in names}
    baselines = {n: snap(100, admitted=10, pod=n) for n in names}
    o = observe(pods, current, baselines, now_s=161, stale_after_s=45, max_window_s=120)
    assert (o.active, o.starting, o.warm, o.warm_serving, o.reporting, o.fresh, o.stale) == (1, 0, 2, 1, 2, 2, ())
    assert o.admitted_per_s == 2 * 60 / 60
    assert (o.in_flight_tokens, o.token_budget, o.queue_depth) == (1200, 2000, 2)
    assert o.utilization == 1200 / (1 * 1000)  # both pods' load over what the one active replica holds
    # the law sizes the active replicas for all the serving load: 2 at 75 % (1200 / 750 tokens), the
    # warm one on top
    _, state = law.decide(law.Policy(), o, law.LawState(), now_s=0.0)
    decision, _ = law.decide(law.Policy(), o, state, now_s=15.0)  # over the band on two readings
    assert (decision.current, decision.desired) == (1, 2)
    without = [p if p.name != "w" else PodInfo("w", role="warm") for p in pods]
    o = observe(without, current, baselines, now_s=161, stale_after_s=45, max_window_s=120)
    assert (o.active, o.warm, o.warm_serving, o.reporting, o.in_flight_tokens) == (1, 2, 0, 1, 600)
    assert law.decide(law.Policy(), o, law.LawState(), now_s=0.0)[0].desired == 1


def test_a_silent_serving_warm_pod_holds_the_pool_like_an_active_one() -> None:
    # its load is unseen, so the demand the others show is not the pool's: never a scale-down on it
    pods = [PodInfo("a"), PodInfo("w", role="warm", serving=True), PodInfo("idle", role="warm")]
    current = {"a": snap(160, admitted=70, pod="a")}
    baselines = {"a": snap(100, admitted=10, pod="a"), "w": snap(100, admitted=10, pod="w")}
    o = observe(pods, current, baselines, now_s=161, stale_after_s=45, max_window_s=120)
    assert (o.active, o.reporting, o.stale) == (1, 1, ("w",))
    frozen = {**current, "w": snap(100, admitted=10, pod="w")}  # answers, but the same document again
    assert observe(pods, frozen, baselines, now_s=130, stale_after_s=45, max_window_s=120).stale == ("w",)
    # out of the Service (or not Ready yet), a warm pod's silence is no missing load
    quiet = [PodInfo("a"), PodInfo("w", role="warm"), PodInfo("idle", role="warm", serving=True, ready=False)]
    o = observe(quiet, current, baselines, now_s=161, stale_after_s=45, max_window_s=120)
    assert (o.stale, o.starting) == ((), 0)


def test_a_replica_that_joined_within_the_window_is_not_counted_twice() -> None:
    # 12 req/s arrive. Two replicas took 6/s each until a third joined 10 s ago; since then 4/s each.
    # Over the 60 s window the old two admitted 50 x 6 + 10 x 4 = 340 each, the new one 40.
    pods = [PodInfo("a"), PodInfo("b"), PodInfo("new")]
    current = {
        "a": snap(160, admitted=1340, pod="a"),
        "b": snap(160, admitted=1340, pod="b"),
        "new": snap(160, admitted=40, started=150, instance="n", pod="new"),
    }
    baselines = {"a": snap(100, admitted=1000, pod="a"), "b": snap(100, admitted=1000, pod="b"), "new": None}
    o = observe(pods, current, baselines, now_s=161, stale_after_s=45, max_window_s=120, window_s=60)
    assert o.reporting == 3
    assert abs(o.admitted_per_s - 12.0) < 1e-9  # 720 requests in 60 s, not 340/60 x 2 + 40/10 = 15.3/s
    assert abs(o.rate_replicas - (2 + 10 / 60)) < 1e-9  # the new replica served a sixth of the window
    # what a replica admits is unchanged by the join: 12 / 2.17 = 5.5/s, not 15.3 / 3 = 5.1/s
    assert abs(o.admitted_per_s / o.rate_replicas - 720 / 130) < 1e-9
    # a pool whose replicas all started within the window is measured over their time, not the window's
    young = {n: snap(160, admitted=40, started=150, instance=n, pod=n) for n in ("a", "b", "new")}
    o = observe(pods, young, dict.fromkeys(young), now_s=161, stale_after_s=45, max_window_s=120, window_s=60)
    assert (o.admitted_per_s, o.rate_replicas) == (12.0, 3.0)


def test_a_warm_pod_labelled_serving_that_takes_no_request_is_no_share_of_the_need() -> None:
    # The Service does not route to "w" yet (endpoints lag, or a Service still selecting role=active):
    # its sidecar answers, fresh, but decided nothing in the window and holds no tokens. Counted as a
    # serving warm replica, the law would take its share of the need off the three active ones.
    pods = [PodInfo(n) for n in ("a1", "a2", "a3")] + [PodInfo("w", role="warm", serving=True)]
    current = {p.name: snap(160, admitted=70, in_flight_tokens=100, token_budget=1000, pod=p.name) for p in pods[:3]}
    current["w"] = snap(160, admitted=10, token_budget=1000, pod="w")
    baselines = {p.name: snap(100, admitted=10, pod=p.name) for p in pods}
    o = observe(pods, current, baselines, now_s=161, stale_after_s=45, max_window_s=120)
    assert (o.active, o.warm, o.warm_serving, o.reporting, o.fresh, o.stale) == (3, 1, 0, 3, 3, ())
    assert law.active_need(law.Policy(), o, 3) == 3
    # nor is it a replica of the rates: what one replica admits (the knee c) is what the three admit
    assert o.admitted_per_s / o.rate_replicas == 1.0
    # a queue is load too (requests waiting for its budget)
    current["w"] = snap(160, admitted=10, token_budget=1000, queue_depth=2, pod="w")
    assert observe(pods, current, baselines, now_s=161, stale_after_s=45, max_window_s=120).queue_depth == 2
    # once the Service sends it requests, it carries its share: the active replicas may be one fewer
    current["w"] = snap(160, admitted=70, in_flight_tokens=100, token_budget=1000, pod="w")
    o = observe(pods, current, baselines, now_s=161, stale_after_s=45, max_window_s=120)
    assert (o.warm_serving, o.reporting) == (1, 4) and law.active_need(law.Policy(), o, 3) == 2
