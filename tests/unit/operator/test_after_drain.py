"""Drained replicas: the Event says which went back to the warm pool and which the ReplicaSet removes."""

import pytest

from tidegate.api import constants
from tidegate.operator import names
from tidegate.operator.reconcile import _relabel, after_drain_events
from tidegate.operator.warm_pool import PodView, after_drain, plan

pytestmark = pytest.mark.unit


def pod(name: str, role: str, ready: bool = True, created: float = 0.0, **kw) -> PodView:
    return PodView(name=name, role=role, ready=ready, created_s=created, **kw)


def _drained(name: str, created: float = 0.0, ready: bool = True) -> PodView:
    return pod(name, constants.ROLE_DRAINING, ready=ready, created=created, draining_since_s=1.0, in_flight=0)


def test_a_full_warm_pool_removes_the_drained_replicas_and_says_so() -> None:
    # Input: 3 -> 1 active with a warm pool of 1 that is already full; both drained pods are idle.
    views = [pod("a", constants.ROLE_ACTIVE), pod("w", constants.ROLE_WARM), _drained("d1", 1), _drained("d2", 2)]
    p = plan(views, desired_active=1, warm_size=1, now_s=10, drain_timeout_s=30)
    assert sorted(p.return_to_warm) == ["d1", "d2"]
    assert p.deployment_replicas == 2  # the ReplicaSet deletes two of the four pods
    after = after_drain(views, p, warm_size=1)
    assert (after.returned, after.removed) == ([], ["d1", "d2"])
    events = after_drain_events(after, warm_size=1)
    assert events == ["2 drained replica(s) removed, the warm pool of 1 being full: d1, d2"]
    assert not any("returned to the warm pool" in e for e in events)


def test_drained_replicas_fill_the_warm_pool_first_and_only_the_rest_are_removed() -> None:
    # Input: warm pool of 2 with one Ready warm pod and one still loading; two Ready pods drained.
    views = [
        pod("a", constants.ROLE_ACTIVE),
        pod("w", constants.ROLE_WARM),
        pod("loading", constants.ROLE_WARM, ready=False),
        _drained("old", 1),
        _drained("new", 5),
    ]
    p = plan(views, desired_active=1, warm_size=2, now_s=10, drain_timeout_s=30)
    after = after_drain(views, p, warm_size=2)
    # The loading pod is not Ready: the ReplicaSet deletes it before any Ready one, so it leaves room.
    assert (after.returned, after.removed, after.room) == (["old"], ["new"], 1)
    assert after_drain_events(after, warm_size=2) == [
        "1 drained replica(s) returned to the warm pool: old",
        "1 drained replica(s) removed, the warm pool of 2 being full: new",
    ]


def test_an_empty_warm_pool_takes_every_drained_replica() -> None:
    views = [pod("a", constants.ROLE_ACTIVE), _drained("d1"), _drained("d2")]
    p = plan(views, desired_active=1, warm_size=2, now_s=10, drain_timeout_s=30)
    after = after_drain(views, p, warm_size=2)
    assert (sorted(after.returned), after.removed) == (["d1", "d2"], [])
    assert after_drain_events(after, warm_size=2) == ["2 drained replica(s) returned to the warm pool: d1, d2"]
    assert after_drain_events(after_drain(views, plan(views[:1], 1, 2, 10, 30), 2), 2) == []


class _Kube:
    def __init__(self) -> None:
        self.costs: dict[str, str] = {}

    def patch_pod(self, namespace: str, name: str, labels: dict, annotations: dict) -> None:
        self.costs[name] = annotations.get(names.ANNOTATION_DELETION_COST)


def test_removed_replicas_keep_the_lowest_deletion_cost_so_the_replicaset_deletes_those() -> None:
    views = [
        pod("a", constants.ROLE_ACTIVE, serving="true"),
        pod("w", constants.ROLE_WARM, serving="false"),
        _drained("d1", 1),
        _drained("d2", 2),
    ]
    p = plan(views, desired_active=1, warm_size=2, now_s=10, drain_timeout_s=30)
    after = after_drain(views, p, warm_size=2)
    kube = _Kube()
    _relabel(kube, "ns", p, now_s=10, removed=frozenset(after.removed))  # type: ignore[arg-type]
    assert kube.costs == {"d1": str(names.COST_WARM), "d2": str(names.COST_DRAINING)}
    assert names.COST_DRAINING < names.COST_WARM
