"""KedaReady tells the truth when the HPA that KEDA built cannot read the pool's metric.

Seen on the local cluster with the real KEDA v2.21.0: with KEDA's metrics API server down, the HPA
said `ScalingActive=False FailedGetExternalMetric` and nothing scaled, while the pool said
`KedaReady=True Applied` and `ScalerReachable=True`: nothing in `kubectl describe tgpool` told why.
"""

from typing import Any

from tests.invalid_pools import valid_pool
from tidegate.api.pool import InferencePool
from tidegate.operator import reconcile
from tidegate.operator.conditions import Integration
from tidegate.operator.settings import OperatorSettings

# the HPA controller's own message (Kubernetes v1.36.3), as read back from the local cluster
FAILED = (
    "the HPA was unable to compute the replica count: unable to get external metric "
    "default/s0-tidegate-loop-desired-replicas/&LabelSelector{MatchLabels:map[string]string"
    "{scaledobject.keda.sh/name: loop,},MatchExpressions:[]LabelSelectorRequirement{},}: unable to fetch "
    "metrics from external metrics API: the server is currently unable to handle the request "
    "(get s0-tidegate-loop-desired-replicas.external.metrics.k8s.io)"
)


class _Kube:
    """Just what ``_keda`` reads and writes: a Ready ScaledObject and KEDA's HPA."""

    def __init__(self, scaling_active: dict[str, str] | None) -> None:
        self.hpa: dict[str, Any] | None = (
            None
            if scaling_active is None
            else {
                "spec": {"metrics": [{"type": "External"}]},
                "status": {"conditions": [{"type": "AbleToScale", "status": "True"}, scaling_active]},
            }
        )
        self.so = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}

    def has_api(self, *_: Any) -> bool:
        return True

    def get(self, _api: str, kind: str, *_: Any) -> dict[str, Any] | None:
        return self.hpa if kind == "HorizontalPodAutoscaler" else self.so

    def apply(self, _manifest: dict[str, Any]) -> dict[str, Any]:
        return self.so

    def delete(self, *_: Any) -> None:
        raise AssertionError("nothing to delete here")


def _keda(scaling_active: dict[str, str] | None, so_status: dict[str, Any] | None = None) -> tuple[Integration, str]:
    body = valid_pool("loop")
    body["metadata"]["namespace"] = "default"
    pool = InferencePool.model_validate(body)
    kube = _Kube(scaling_active)
    if so_status is not None:
        kube.so = {"status": so_status}
    state, message, _, _ = reconcile._keda(kube, OperatorSettings(), pool, {}, lambda _address: True)
    return state, message


def test_an_hpa_that_cannot_read_the_metric_makes_keda_not_ready_with_its_words() -> None:
    state, message = _keda(
        {"type": "ScalingActive", "status": "False", "reason": "FailedGetExternalMetric", "message": FAILED}
    )
    assert state is Integration.NOT_READY
    assert "HPA keda-hpa-loop cannot compute this pool's replicas, so nothing scales it" in message
    assert "FailedGetExternalMetric" in message and "the server is currently unable to handle the request" in message
    assert "LabelSelector" not in message  # the selector dump says nothing to a user
    assert "v1beta1.external.metrics.k8s.io" in message  # where to look


def test_an_hpa_that_scales_or_is_off_at_zero_replicas_leaves_keda_ready() -> None:
    ok = {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound", "message": "..."}
    assert _keda(ok)[0] is Integration.APPLIED
    # at 0 replicas the HPA is off by design (KEDA's own loop decides 0 <-> 1)
    off = {"type": "ScalingActive", "status": "False", "reason": "ScalingDisabled", "message": "scaling is disabled"}
    assert _keda(off)[0] is Integration.APPLIED


def test_a_scaled_object_no_keda_operator_acted_on_says_so() -> None:
    # seen with the KEDA operator killed: a new pool's ScaledObject got no status and no HPA, and
    # the pool said KedaReady=True Applied
    state, message = _keda(None, so_status={})
    assert state is Integration.NOT_RECONCILED
    assert message.startswith("KEDA has not reconciled ScaledObject loop")
    assert "is the KEDA operator running?" in message
