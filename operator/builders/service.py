"""Service ``<pool>`` (active pods only, through the sidecar) and the PodDisruptionBudget."""

from typing import Any

from tidegate.api import constants
from tidegate.api.pool import InferencePool
from tidegate.operator import names
from tidegate.operator.settings import OperatorSettings


def service(pool: InferencePool, settings: OperatorSettings) -> dict[str, Any]:
    """ClusterIP Service on port 80 selecting ``role=active`` pods, targeting the sidecar port.

    Warm and draining pods are outside the selector, so promotion or demotion is one label
    write and the endpoints follow within seconds.
    """
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
            "selector": {**names.selector_labels(pool), constants.LABEL_ROLE: constants.ROLE_ACTIVE},
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
