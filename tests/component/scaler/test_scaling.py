"""What the scaler asks KEDA for, given what real stats servers report over loopback."""

from tests.component.scaler.conftest import NAMESPACE, POOL, Rig
from tidegate.scaler.pods import PodInfo


def _overload(rig: Rig, tenants: int = 5, admitted: int = 300, refused: int = 150) -> None:
    """15 s in which each pod admits ``admitted`` and refuses ``refused`` for capacity, over ``tenants`` tenants."""
    for p in rig.pods:
        p.in_flight_tokens = p.fake.snapshot.token_budget  # full
        for t in range(tenants):
            p.serve(f"tenant-{t}", admitted=admitted // tenants, capacity=refused // tenants)
    rig.tick()


def _steady(rig: Rig, policy_rejected_by_one_tenant: int = 0) -> None:
    """15 s of comfortable load (75 % of the budget in flight), plus an optional quota-buster."""
    for p in rig.pods:
        p.in_flight_tokens = int(0.75 * p.fake.snapshot.token_budget)
        for t in range(4):
            p.serve(f"tenant-{t}", admitted=50)
        if policy_rejected_by_one_tenant:
            p.serve("greedy", admitted=5, policy=policy_rejected_by_one_tenant)
    rig.tick()


async def test_overload_raises_desired_and_says_why(rig: Rig) -> None:
    assert await rig.desired() == 4.0
    _overload(rig)
    # per pod 300 admitted + 150 refused: demand 1.5x what a replica admits, sized for 75 %:
    # ceil(4 * 1.5 / 0.75) = 8; step limit 4 + 4 = 8
    assert await rig.desired() == 8.0
    assert (await rig.stub.IsActive(rig.ref())).result is True
    samples = {
        (s.labels["pool"], s.labels["reason"]): s.value
        for m in rig.metric.registry.collect()
        if m.name == "tidegate_scaler_desired_replicas"
        for s in m.samples
    }
    assert samples == {(POOL, "saturated"): 8.0}


async def test_rising_capacity_rejections_never_lower_desired(rig: Rig) -> None:
    await rig.desired()
    seen = []
    for refused in (0, 20, 80, 200, 600):
        _overload(rig, refused=refused)
        seen.append(await rig.desired(maxScaleUpStep="100"))
    assert seen == sorted(seen) and seen[-1] > seen[0]


async def test_one_tenant_far_over_quota_buys_nothing(rig: Rig) -> None:
    await rig.desired()
    for _ in range(4):
        _steady(rig, policy_rejected_by_one_tenant=2000)  # 'greedy' refused 2000 times per pod per poll
        assert await rig.desired() == 4.0


async def test_a_silent_pod_holds_the_count_instead_of_scaling_down(rig: Rig) -> None:
    await rig.desired(scaleDownCooldownSeconds="0")
    rig.pods[3].fake.status = 503  # one sidecar stops answering
    for p in rig.pods:
        p.in_flight_tokens = 500  # and the rest are nearly idle: demand fits 1 replica
    rig.tick()
    assert await rig.desired(scaleDownCooldownSeconds="0") == 4.0
    assert (await rig.stub.IsActive(rig.ref())).result is True
    rig.pods[3].fake.status = 200  # it answers again: now the pool may shrink
    rig.tick()
    assert await rig.desired(scaleDownCooldownSeconds="0") < 4.0


async def test_frozen_stats_count_as_missing(rig: Rig) -> None:
    await rig.desired(scaleDownCooldownSeconds="0")
    for p in rig.pods:
        p.in_flight_tokens = 0
    rig.tick()
    rig.clock.now += 120  # nobody published for two minutes: every document is stale
    assert await rig.desired(scaleDownCooldownSeconds="0") == 4.0
    assert (await rig.stub.IsActive(rig.ref(minReplicas="0"))).result is True


async def test_a_restarted_sidecar_is_not_read_as_negative_demand(rig: Rig) -> None:
    await rig.desired()
    _steady(rig)
    await rig.desired()
    p = rig.pods[0]
    p.admitted, p.rejected, p.tenants = 0, {}, {}
    _steady(rig)
    snap = p.fake.snapshot
    p.fake.snapshot = snap.model_copy(update={"instance_id": "restarted", "started_at_s": snap.time_s - 10})
    assert await rig.desired() == 4.0


def _serve_warm(rig: Rig, serving: bool) -> None:
    """Pods 0-2 active, pod 3 a Ready warm replica, in the Service when ``serving`` (spec.warmPool.serve)."""
    rig.source.set(
        NAMESPACE,
        POOL,
        [PodInfo(p.name, p.fake.url) for p in rig.pods[:3]]
        + [PodInfo(rig.pods[3].name, rig.pods[3].fake.url, role="warm", serving=serving)],
    )


async def test_a_serving_warm_replicas_load_sizes_the_active_ones_beneath_it(rig: Rig) -> None:
    # every pod at 75 % of its budget: 3 active replicas carry their own load, but with the warm one
    # serving too they must carry all four's (ceil(4 x 0.75 / 0.75) = 4), the warm one on top
    for serving, want in ((False, 3.0), (True, 4.0)):
        _serve_warm(rig, serving)
        await rig.desired(maxReplicas="20")
        _steady(rig)
        assert await rig.desired(maxReplicas="20") == want


async def test_a_silent_serving_warm_replica_holds_the_count(rig: Rig) -> None:
    _serve_warm(rig, True)
    await rig.desired(scaleDownCooldownSeconds="0")
    rig.pods[3].fake.status = 503  # the serving warm replica stops answering: its load is unseen
    for p in rig.pods:
        p.in_flight_tokens = 500  # the active ones are nearly idle: they alone would fit 1 replica
    rig.tick()
    assert await rig.desired(scaleDownCooldownSeconds="0") == 3.0
    _serve_warm(rig, False)  # out of the Service, its silence is no missing load
    rig.tick()
    assert await rig.desired(scaleDownCooldownSeconds="0") < 3.0
