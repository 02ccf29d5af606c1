"""The warm-pool planner: promotion first, draining before removal, never a not-Ready pod as warm."""

from hypothesis import given
from hypothesis import strategies as st

from tidegate.operator.warm_pool import PodView, plan


def pod(name: str, role: str, ready: bool = True, created: float = 0.0, **kw) -> PodView:
    return PodView(name=name, role=role, ready=ready, created_s=created, **kw)


def test_scale_up_promotes_the_longest_loaded_ready_warm_pods() -> None:
    pods = [
        pod("a", "active"),
        pod("w-old", "warm", created=1),
        pod("w-new", "warm", created=5),
        pod("w-cold", "warm", ready=False),
    ]
    p = plan(pods, desired_active=3, warm_size=2, now_s=100, drain_timeout_s=30)
    assert p.promote == ["w-old", "w-new"]
    assert p.deployment_replicas == 5  # 3 active + 2 warm refills
    assert p.warm_ready == 0  # the cold pod is not Ready: not counted as warm


def test_not_ready_warm_pods_are_not_promoted() -> None:
    p = plan([pod("w", "warm", ready=False)], desired_active=1, warm_size=1, now_s=0, drain_timeout_s=30)
    assert p.promote == []
    assert p.deployment_replicas == 2


def test_scale_down_drains_not_ready_then_newest_active_pods() -> None:
    pods = [
        pod("old", "active", created=1),
        pod("new", "active", created=9),
        pod("sick", "active", ready=False, created=5),
    ]
    p = plan(pods, desired_active=1, warm_size=1, now_s=100, drain_timeout_s=30)
    assert p.drain == ["sick", "new"]
    assert p.deployment_replicas == 1 + 1 + 2  # draining pods stay until drained


def test_draining_pods_return_to_warm_when_idle_or_timed_out() -> None:
    pods = [
        pod("a", "active"),
        pod("idle", "draining", draining_since_s=99, in_flight=0),
        pod("busy", "draining", draining_since_s=99, in_flight=3),
        pod("stuck", "draining", draining_since_s=50, in_flight=3),
    ]
    p = plan(pods, desired_active=1, warm_size=1, now_s=100, drain_timeout_s=30)
    assert sorted(p.return_to_warm) == ["idle", "stuck"]
    assert p.draining == 1 and p.deployment_replicas == 3


def test_a_draining_pod_is_promoted_back_before_any_warm_pod() -> None:
    pods = [pod("d", "draining", created=9, draining_since_s=1), pod("w", "warm", created=1)]
    p = plan(pods, desired_active=1, warm_size=1, now_s=2, drain_timeout_s=30)
    assert p.promote == ["d"]


def test_pods_being_deleted_are_ignored() -> None:
    p = plan([pod("gone", "active", deleting=True)], desired_active=1, warm_size=0, now_s=0, drain_timeout_s=1)
    assert p.active == 0 and p.deployment_replicas == 1


roles = st.sampled_from(["active", "warm", "draining"])
pods_st = st.lists(
    st.builds(
        PodView,
        name=st.uuids().map(str),
        role=roles,
        ready=st.booleans(),
        created_s=st.floats(0, 100),
        draining_since_s=st.one_of(st.none(), st.floats(0, 100)),
        in_flight=st.one_of(st.none(), st.integers(0, 5)),
        serving=st.sampled_from([None, "true", "false"]),
    ),
    max_size=12,
    unique_by=lambda p: p.name,
)


@given(pods_st, st.integers(0, 10), st.integers(0, 4), st.booleans())
def test_plans_converge_and_never_exceed_what_was_asked(pods, desired, warm, serve) -> None:
    p = plan(pods, desired, warm, now_s=200, drain_timeout_s=30, serve=serve)
    names = [*p.promote, *p.drain, *p.return_to_warm]
    assert len(names) == len(set(names)), "a pod gets one action per plan"
    assert p.active <= max(desired, sum(1 for x in pods if x.role == "active"))
    assert p.deployment_replicas >= desired + warm
    # Applying the plan and planning again: no more promotions or drains.
    after = []
    for x in pods:
        role = (
            "active"
            if x.name in p.promote
            else "draining"
            if x.name in p.drain
            else "warm"
            if x.name in p.return_to_warm
            else x.role
        )
        since = 200.0 if x.name in p.drain else (x.draining_since_s if role == "draining" else None)
        serving = {True: "true", False: "false"}.get(p.label_serving.get(x.name), x.serving)  # type: ignore[arg-type]
        after.append(
            PodView(x.name, role, x.ready, x.created_s, draining_since_s=since, in_flight=x.in_flight, serving=serving)
        )
        # the Service selects exactly the active pods, and the warm ones under serve
        assert (serving == "true") == (role == "active" or (serve and role == "warm"))
    again = plan(after, desired, warm, now_s=200, drain_timeout_s=30, serve=serve)
    assert not again.drain
    assert not again.promote or p.active < desired  # only new ready pods could be promoted
