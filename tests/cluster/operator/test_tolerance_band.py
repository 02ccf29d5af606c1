"""Tolerance band: a saturated pool at 10 replicas that needs 11 is not parked by the HPA's 10%
tolerance.

The HPA does nothing while ``metric / (target x current)`` is within ``[0.9, 1.1]`` (bounds
included; kube-controller-manager's ``--horizontal-pod-autoscaler-tolerance``, default 0.1:
https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details).
tidegate's scaler reports the desired count as an ``AverageValue`` metric with target 1, so a
10 -> 11 answer (ratio 1.1) would leave a saturated pool one replica short for as long as it
stays saturated; the law reports ``hpa_metric_value`` instead, lifted past the tolerance.

Input: pool ``sat`` at 10 active replicas (minReplicas 10, maxReplicas 16); the real scaling law
(``tidegate.scaler.law.decide``, the pool's own policy) given a saturated window at those 10
replicas (4.8% of capacity demand refused, over the 2% target) decides 11. A stub scaler serves
KEDA first the bare count 11, then the law's metric value.

Expected, from the real KEDA v2.21.0 and the real HPA controller (5 s sync, default tolerance):
the bare 11 leaves ``/scale`` at 10 for many syncs (the trap, shown on the real HPA); the law's
value makes the HPA write ``/scale`` above 10. Remove the lift from the law and this test fails.
"""

import time
from collections.abc import Iterator

import kubernetes
import pytest

from tests.cluster.conftest import wait_for
from tests.cluster.operator.conftest import StubScaler
from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION
from tidegate.api.pool import InferencePool
from tidegate.scaler import law

CURRENT = 10
PARKED_S = 30  # six syncs of the cluster's HPA (5 s; cluster.sh)


@pytest.fixture
def scaler() -> Iterator[StubScaler]:
    stub = StubScaler(desired=float(CURRENT)).start()
    yield stub
    stub.stop()


def _pool_body() -> dict:
    body = valid_pool("sat")
    body["spec"].update(
        replicas=CURRENT,
        warmPool={"size": 0},
        # targetUtilization 1: a window that admits 10/s and refuses 0.5/s asks for exactly 11
        scaling={"minReplicas": CURRENT, "maxReplicas": 16, "targetUtilization": 1.0},
    )
    return body


def _saturated_decision(body: dict) -> law.Decision:
    """What the real law decides for pool ``sat`` at CURRENT replicas, saturated by ~5%."""
    pool = InferencePool.model_validate({**body, "metadata": {"name": "sat", "namespace": "any"}})
    policy = law.Policy.from_spec(pool.spec.scaling)
    saturated = law.Observation(
        active=CURRENT,
        reporting=CURRENT,
        window_s=60.0,
        admitted_per_s=10.0,
        capacity_rejected_per_s=0.5,
        capacity_rejected_tenants=3,
    )
    decision, _ = law.decide(policy, saturated, law.LawState(), now_s=0.0)
    return decision


@pytest.mark.timeout(420)
def test_real_hpa_scales_a_saturated_pool_of_ten_past_its_tolerance_on_the_laws_metric(
    api_client, namespace: str, operator_for, scaler: StubScaler
) -> None:
    body = _pool_body()
    decision = _saturated_decision(body)
    assert (decision.reason, decision.desired) == (law.Reason.SATURATED, CURRENT + 1), decision.text
    custom = kubernetes.client.CustomObjectsApi(api_client)
    autoscaling = kubernetes.client.AutoscalingV2Api(api_client)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def pool() -> dict:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "sat")

    def hpa() -> kubernetes.client.V2HorizontalPodAutoscaler | None:
        try:
            return autoscaling.read_namespaced_horizontal_pod_autoscaler("keda-hpa-sat", namespace)
        except kubernetes.client.ApiException:
            return None

    def hpa_settled_at_current() -> bool:
        status = pool().get("status", {})
        h = hpa()
        active = {c.type: c.status for c in (h.status.conditions or [])} if h else {}
        return (
            status.get("replicas") == CURRENT
            and status.get("readyReplicas") == CURRENT
            and h is not None
            and h.status.current_replicas == CURRENT
            and active.get("ScalingActive") == "True"
        )

    try:
        # The pool runs its 10 replicas and the real HPA reads the scaler (steady: metric 10).
        wait_for(hpa_settled_at_current, timeout_s=180, interval_s=1, what=f"{CURRENT} ready replicas, HPA reading")

        # The bare count 11 is inside the tolerance (11 / 10 = 1.1): the real HPA leaves the pool at 10.
        scaler.desired = float(decision.desired)
        asked = len(scaler.calls)
        since = time.monotonic()
        while time.monotonic() - since < PARKED_S:
            assert pool()["spec"]["replicas"] == CURRENT, "the HPA moved on a ratio inside its tolerance"
            time.sleep(1)
        polled = [name for name, _ in scaler.calls[asked:] if name == "GetMetrics"]
        assert len(polled) >= 3, f"the HPA asked the scaler only {len(polled)} times in {PARKED_S} s"
        assert hpa().status.desired_replicas == CURRENT

        # The law's own metric value: lifted past the tolerance, so the real HPA scales out.
        scaler.desired = decision.metric_value
        lifted = time.monotonic()
        wait_for(
            lambda: pool()["spec"]["replicas"] > CURRENT,
            timeout_s=90,
            interval_s=1,
            what="the HPA writes /scale above 10",
        )
        written = pool()["spec"]["replicas"]
        assert written <= decision.metric_value, written
        print(
            f"\nlaw: {decision.text}; metric {decision.metric_value:g}. Bare {decision.desired}: /scale stayed "
            f"{CURRENT} for {PARKED_S} s ({len(polled)} GetMetrics); law's value: /scale {CURRENT} -> {written} "
            f"in {time.monotonic() - lifted:.0f} s"
        )
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "sat")
        wait_for(
            lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
            timeout_s=90,
            what="pool sat deleted",
        )
