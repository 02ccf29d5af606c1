"""The serving label and the Service that selects it (``spec.warmPool.serve``, #13).

Every pod of a pool carries ``tidegate.dev/serving``: the Service sends requests to the ``"true"``
ones (active pods; warm ones under ``serve``). A full reconcile runs here against an in-memory API
(:class:`_Kube`) that records, in order, each pod patch and each Service the operator applies, so a
test can check what the endpoints controller would have seen at that moment.
"""

import copy
import datetime
from typing import Any

import kubernetes
import pytest

from tests.invalid_pools import valid_pool
from tidegate.api import constants
from tidegate.operator import reconcile
from tidegate.operator.settings import OperatorSettings
from tidegate.operator.warm_pool import PodView, plan, serving_selector_safe

pytestmark = pytest.mark.unit

ACTIVE, WARM, DRAINING = constants.ROLE_ACTIVE, constants.ROLE_WARM, constants.ROLE_DRAINING
SERVING = constants.LABEL_SERVING


def view(name: str, role: str, serving: str | None = None, **kw: Any) -> PodView:
    ready, created = kw.pop("ready", True), kw.pop("created", 0.0)
    return PodView(name=name, role=role, ready=ready, created_s=created, serving=serving, **kw)


# ---- the planner ------------------------------------------------------------------------------


def test_every_pod_is_labelled_serving_by_its_role_and_warm_ones_by_serve() -> None:
    pods = [view("a", ACTIVE), view("w", WARM), view("d", DRAINING, draining_since_s=99, in_flight=2)]
    off = plan(pods, desired_active=1, warm_size=1, now_s=100, drain_timeout_s=30)
    assert off.label_serving == {"a": True, "w": False, "d": False}
    on = plan(pods, desired_active=1, warm_size=1, now_s=100, drain_timeout_s=30, serve=True)
    assert on.label_serving == {"a": True, "w": True, "d": False}  # draining: out of the Service either way


def test_flipping_serve_relabels_only_the_warm_pods() -> None:
    labelled = [view("a", ACTIVE, "true"), view("w1", WARM, "false"), view("w2", WARM, "false")]
    assert plan(labelled, 1, 2, 0, 30).empty  # converged under serve=false
    on = plan(labelled, 1, 2, 0, 30, serve=True)
    assert on.label_serving == {"w1": True, "w2": True} and not (on.promote or on.drain)
    serving_warm = [view("a", ACTIVE, "true"), view("w1", WARM, "true"), view("w2", WARM, "true")]
    assert plan(serving_warm, 1, 2, 0, 30, serve=False).label_serving == {"w1": False, "w2": False}


def test_a_relabelled_pod_gets_its_serving_label_in_the_same_plan() -> None:
    pods = [view("a", ACTIVE, "true"), view("b", ACTIVE, "true", created=5), view("w", WARM, "false")]
    down = plan(pods, desired_active=1, warm_size=1, now_s=0, drain_timeout_s=30)
    assert down.drain == ["b"] and down.label_serving == {"b": False}  # out of the Service at once
    up = plan(pods, desired_active=3, warm_size=1, now_s=0, drain_timeout_s=30)
    assert up.promote == ["w"] and up.label_serving == {"w": True}
    # under serve a warm pod already serves: its promotion changes no serving label
    pods_serving = [view("a", ACTIVE, "true"), view("w", WARM, "true")]
    assert plan(pods_serving, 2, 1, 0, 30, serve=True).label_serving == {}


def test_draining_pods_returned_to_a_serving_warm_pool_rejoin_the_service() -> None:
    pods = [view("a", ACTIVE, "true"), view("d", DRAINING, "false", draining_since_s=1, in_flight=0)]
    p = plan(pods, desired_active=1, warm_size=1, now_s=2, drain_timeout_s=30, serve=True)
    assert p.return_to_warm == ["d"] and p.label_serving == {"d": True}


def test_the_service_switches_to_the_serving_label_only_once_every_active_pod_carries_it() -> None:
    assert serving_selector_safe([])  # a new pool: nothing to lose
    upgraded = [view("a", ACTIVE), view("b", ACTIVE, "true"), view("w", WARM)]
    assert not serving_selector_safe(upgraded)  # "a" would leave the Service
    assert serving_selector_safe([view("a", ACTIVE, "true"), view("b", ACTIVE, "true"), view("w", WARM)])
    assert serving_selector_safe([view("a", ACTIVE, "true"), view("gone", ACTIVE, deleting=True)])


# ---- a reconcile against an in-memory API ------------------------------------------------------


class _Kube:
    """Pods in memory; every call that changes them or the Service is logged in order."""

    def __init__(self, pods: dict[str, dict[str, str]]) -> None:
        self.pods = {name: dict(labels) for name, labels in pods.items()}
        self.log: list[tuple[str, Any]] = []
        self.services: list[dict[str, str]] = []  # each Service selector applied, in order
        self.deployments: list[dict[str, Any]] = []

    def pool_pods(self, namespace: str, pool: str) -> list[kubernetes.client.V1Pod]:
        created = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        return [
            kubernetes.client.V1Pod(
                metadata=kubernetes.client.V1ObjectMeta(
                    name=name, labels=dict(labels), annotations={}, creation_timestamp=created
                ),
                spec=kubernetes.client.V1PodSpec(containers=[], node_name="n"),
                status=kubernetes.client.V1PodStatus(
                    phase="Running",
                    pod_ip=None,
                    conditions=[kubernetes.client.V1PodCondition(type="Ready", status="True")],
                ),
            )
            for name, labels in self.pods.items()
        ]

    def patch_pod(self, namespace: str, name: str, labels: dict, annotations: dict) -> None:
        for key, value in labels.items():
            if value is None:
                self.pods[name].pop(key, None)
            else:
                self.pods[name][key] = value
        self.log.append(("patch", name, dict(labels)))

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if manifest["kind"] == "Service":
            selector = manifest["spec"]["selector"]
            self.services.append(selector)
            # what the endpoints controller would select now
            chosen = sorted(n for n, labels in self.pods.items() if selector.items() <= labels.items())
            self.log.append(("service", chosen))
        if manifest["kind"] == "Deployment":
            self.deployments.append(copy.deepcopy(manifest))
        return manifest

    def has_api(self, *_: Any) -> bool:
        return False  # no KEDA, no Karpenter: not what these tests are about

    def get(self, *_: Any) -> None:
        return None

    def pod_events(self, *_: Any) -> list[Any]:
        return []

    def patch_pool_status(self, *_: Any) -> None:
        pass

    def event(self, *_: Any, **__: Any) -> None:
        pass


def _pool(**warm_pool: Any) -> dict[str, Any]:
    body = valid_pool("p")
    body["metadata"].update(namespace="ml", uid="u-1", generation=1)
    body["spec"].update(replicas=1, warmPool={"size": 1, **warm_pool})
    return body


def _reconcile(kube: _Kube, obj: dict[str, Any]) -> reconcile.Result:
    return reconcile.reconcile(kube, OperatorSettings(), obj, lambda _address: True, now_s=1e9)  # type: ignore[arg-type]


def _labels(pool: str, role: str, serving: str | None = None) -> dict[str, str]:
    labels = {constants.LABEL_POOL: pool, constants.LABEL_ROLE: role}
    return labels | ({SERVING: serving} if serving else {})


def test_an_operator_upgrade_labels_the_pods_before_the_service_selects_the_label() -> None:
    # Pods of an operator before the serving label: the Service selected role=active.
    kube = _Kube({"a": _labels("p", ACTIVE), "w": _labels("p", WARM)})
    _reconcile(kube, _pool(serve=False))
    # First reconcile: both pods labelled, and the Service still on role=active (the endpoints
    # controller may not have seen the labels yet: they are read back before the switch)
    assert kube.services == [{constants.LABEL_POOL: "p", constants.LABEL_ROLE: ACTIVE}]
    assert kube.pods["a"][SERVING] == "true" and kube.pods["w"][SERVING] == "false"
    _reconcile(kube, _pool(serve=False))
    assert kube.services[-1] == {constants.LABEL_POOL: "p", SERVING: "true"}
    # The active pod was in the Service at every Service write, and never a warm one.
    assert [entry[1] for entry in kube.log if entry[0] == "service"] == [["a"], ["a"]]
    _reconcile(kube, _pool(serve=False))
    assert kube.services[-1] == {constants.LABEL_POOL: "p", SERVING: "true"}  # and stays


def test_flipping_serve_moves_the_warm_pod_in_and_out_of_the_service_without_touching_the_deployment() -> None:
    kube = _Kube({"a": _labels("p", ACTIVE, "true"), "w": _labels("p", WARM, "false")})
    _reconcile(kube, _pool(serve=False))
    assert kube.log[-1] == ("service", ["a"])
    _reconcile(kube, _pool())  # serve unset: the default, true
    assert kube.log[-1] == ("service", ["a", "w"])  # the warm pod serves, in the same reconcile
    _reconcile(kube, _pool(serve=False))
    assert kube.log[-1] == ("service", ["a"])  # and leaves at once
    templates = [d["spec"]["template"] for d in kube.deployments]
    assert templates[0] == templates[1] == templates[2]  # no rollout: the label lives on the pods only
    assert SERVING not in templates[0]["metadata"]["labels"]


def test_the_sidecar_hears_the_serving_state_with_the_role(monkeypatch: pytest.MonkeyPatch) -> None:
    pushed: list[tuple[str | None, str, bool | None]] = []

    def push(ip, port, role, token, timeout_s=0.3, serving=None):
        pushed.append((ip, role, serving))
        return True

    monkeypatch.setattr(reconcile, "push_role", push)
    kube = _Kube({"a": _labels("p", ACTIVE, "true"), "w": _labels("p", WARM, "false")})
    _reconcile(kube, _pool(serve=True))
    assert pushed == [(None, WARM, True)]  # a serving-only change is pushed too, not left to the file
    pushed.clear()
    obj = _pool(serve=True)
    obj["spec"]["replicas"] = 2
    _reconcile(kube, obj)
    assert pushed == [(None, ACTIVE, True)]
    pushed.clear()
    obj["spec"]["replicas"] = 1
    _reconcile(kube, obj)
    assert pushed == [(None, DRAINING, False)]


def test_a_drained_pod_the_full_warm_pool_removes_does_not_rejoin_a_serving_warm_pool() -> None:
    # 2 -> 1 active has drained "d"; the warm pool of 1 is full, so the ReplicaSet deletes "d" next
    kube = _Kube(
        {"a": _labels("p", ACTIVE, "true"), "w": _labels("p", WARM, "true"), "d": _labels("p", DRAINING, "false")}
    )
    result = _reconcile(kube, _pool(serve=True))
    assert result.plan.return_to_warm == ["d"] and result.plan.deployment_replicas == 2
    assert kube.pods["d"][constants.LABEL_ROLE] == WARM and kube.pods["d"][SERVING] == "false"
    assert kube.log[-1] == ("service", ["a", "w"])
