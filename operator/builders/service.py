"""Service ``<pool>`` (the serving pods, through the sidecar) and the PodDisruptionBudget."""

from typing import Any

from tidegate.api import constants
from tidegate.api.pool import InferencePool
from tidegate.operator import names
from tidegate.operator.settings import OperatorSettings


def service(pool: InferencePool, settings: OperatorSettings, by_serving: bool = True) -> dict[str, Any]:
    """ClusterIP Service on port 80 selecting ``tidegate.dev/serving=true`` pods, targeting the
    sidecar port.

    The operator labels the active pods ``serving=true``, the warm ones too under
    ``spec.warmPool.serve``, draining ones ``false``: promotion, demotion or a flip of ``serve`` is
    one label write and the endpoints follow within seconds. ``by_serving=False`` selects
    ``role=active`` instead, as operators before the serving label did: the reconcile keeps it until
    every active pod carries the label (:func:`tidegate.operator.warm_pool.serving_selector_safe`).
    """
    chosen = {constants.LABEL_SERVING: "true"} if by_serving else {constants.LABEL_ROLE: constants.ROLE_ACTIVE}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": pool.metadata.name,
            "namespace": pool.metadata.namespace,
            "labels": names.common_labels(pool),
        },
        "spec": {
            "type": "ClusterIP",
            "selector": {**names.selector_labels(pool), **chosen},
            # A number, not the port's name: the EndpointSlice controller resolves named ports
            # only in regular containers, and the sidecar is a native (init) sidecar.
            "ports": [
                {
                    "name": "http",
                    "port": 80,
                    "targetPort": settings.sidecar_port,
                    "protocol": "TCP",
                    "appProtocol": "http",
                }
            ],
        },
    }


def pod_disruption_budget(pool: InferencePool) -> dict[str, Any]:
    """PDB allowing one voluntary eviction at a time across the pool's pods (``policy/v1``).

    ``maxUnavailable: 1`` rather than ``minAvailable``: a pool scaled to one replica can still
    be drained from a node, while an eviction storm cannot take several replicas at once.
    """
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": pool.metadata.name,
            "namespace": pool.metadata.namespace,
            "labels": names.common_labels(pool),
        },
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": names.selector_labels(pool)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
