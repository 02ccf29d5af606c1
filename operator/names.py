"""Names and labels of the objects the operator makes for a pool (pure)."""

import hashlib
from typing import Any

from tidegate.api import constants
from tidegate.api.pool import InferencePool

MODEL_CONTAINER = "model"
SIDECAR_CONTAINER = "tidegate-admission"
CONFIG_FILE = "config.yaml"
CONFIG_DIR = "/etc/tidegate/admission"
PODINFO_DIR = "/etc/tidegate/podinfo"
API_KEYS_DIR = "/etc/tidegate/api-keys"

ANNOTATION_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
ANNOTATION_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
ANNOTATION_DRAINING_SINCE = f"{constants.GROUP}/draining-since"
FINALIZER = f"{constants.GROUP}/nodepool-cleanup"
# On the NodePool: a hash of its spec.template and when that last changed (builders.nodepool.stamp_template).
ANNOTATION_TEMPLATE_HASH = f"{constants.GROUP}/template-hash"
ANNOTATION_TEMPLATE_CHANGED = f"{constants.GROUP}/template-changed-at"
# On the cluster-scoped NodePool (and its nodes): the namespace of the pool that owns it.
LABEL_NAMESPACE = f"{constants.GROUP}/namespace"

# Pod deletion costs: the ReplicaSet removes the cheapest pods first, so a scale-down of the
# Deployment takes draining pods, then warm ones, and never an active one while others exist.
COST_ACTIVE = 1000
COST_WARM = 0
COST_DRAINING = -1000


def selector_labels(pool: InferencePool) -> dict[str, str]:
    """Labels that select every pod of the pool (the Deployment selector and ``status.selector``)."""
    return {constants.LABEL_POOL: pool.metadata.name}


def selector_string(pool: InferencePool) -> str:
    """``status.selector`` for the ``/scale`` subresource (the HPA needs it)."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(pool).items())


def common_labels(pool: InferencePool) -> dict[str, str]:
    """Labels on every child object."""
    return {
        "app.kubernetes.io/name": "tidegate-pool",
        "app.kubernetes.io/instance": pool.metadata.name,
        "app.kubernetes.io/managed-by": "tidegate",
        constants.LABEL_POOL: pool.metadata.name,
    }


def config_map_name(pool: InferencePool) -> str:
    return f"{pool.metadata.name}-admission"


def node_pool_name(pool: InferencePool) -> str:
    """``tidegate-<namespace>-<pool>``, shortened with a hash when over 63 characters.

    Deterministic, so a crashed operator finds the NodePool it made.
    """
    return node_pool_name_of(pool.metadata.namespace, pool.metadata.name)


def node_pool_name_of(namespace: str, pool: str) -> str:
    """:func:`node_pool_name` from the pool's namespace and name alone (a pool being deleted whose
    stored spec this version refuses still has its NodePool found and deleted)."""
    name = f"tidegate-{namespace}-{pool}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:54].rstrip('-')}-{digest}"


def _labels(obj: dict[str, Any] | None) -> dict[str, str]:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def node_pool_owner(node_pool: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """``(namespace, pool)`` a NodePool's labels name (``(None, None)`` for one tidegate did not make)."""
    labels = _labels(node_pool)
    return labels.get(LABEL_NAMESPACE), labels.get(constants.LABEL_POOL)


def owns_node_pool(pool: InferencePool, node_pool: dict[str, Any] | None) -> bool:
    """Whether ``node_pool`` is ``pool``'s own. Names can collide: ``team-a/llm`` and ``team/a-llm``
    are both ``tidegate-team-a-llm``, and only the labels tell them apart. One tidegate made before
    its NodePools carried the namespace label (the pool's name, managed by tidegate) is adopted."""
    return owned_by(pool.metadata.namespace, pool.metadata.name, node_pool)


def owned_by(namespace: str, pool: str, node_pool: dict[str, Any] | None) -> bool:
    """:func:`owns_node_pool` from the pool's namespace and name alone."""
    owner_namespace, owner = node_pool_owner(node_pool)
    if owner != pool:
        return False
    if owner_namespace is None:
        return _labels(node_pool).get("app.kubernetes.io/managed-by") == "tidegate"
    return owner_namespace == namespace


DRAIN_TOKEN_HEADER = "X-Tidegate-Drain-Token"


def drain_token(pool: InferencePool) -> str | None:
    """The token the pod's preStop hook shows the sidecar to drain it (None without a pool UID).

    Derived from the pool's UID so builders stay deterministic; it is in the pod spec and the
    admission ConfigMap, so it keeps out clients of the Service, not readers of the namespace.
    """
    if not pool.metadata.uid:
        return None
    return hashlib.sha256(f"tidegate-drain:{pool.metadata.uid}".encode()).hexdigest()[:32]
