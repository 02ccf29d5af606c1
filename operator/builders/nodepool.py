"""Karpenter NodePool ``tidegate-<namespace>-<pool>`` (``karpenter.sh/v1``, cluster-scoped).

Limits default to (max replicas + warm pool + 1 surge) x GPUs per replica, so a fully scaled
pool never waits on its own NodePool's limit. Disruption defaults to ``WhenEmpty`` with a
budget of one node for every disruption reason (``reasons`` left out: Karpenter reads an empty
list as "no reason", so a budget written ``reasons: []`` would let it disrupt every node at once),
and every replica's pod (active, warm, draining) carries ``karpenter.sh/do-not-disrupt``, so
consolidation and drift only ever take nodes the pool has left empty, never loaded capacity.

Cluster-scoped objects cannot be owned by a namespaced pool: the operator's finalizer deletes it.

Source: https://karpenter.sh/docs/concepts/nodepools/
"""

import datetime
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from tidegate.api.pool import InferencePool
from tidegate.operator import names
from tidegate.operator.builders.deployment import GPU_RESOURCE

ROLLOUT_SURGE = 1


def gpu_limit(pool: InferencePool) -> int:
    """GPUs the NodePool may hold: (maxReplicas + warmPool.size + surge) x gpus per replica."""
    spec = pool.spec
    return (spec.scaling.max_replicas + spec.warm_pool.size + ROLLOUT_SURGE) * spec.server.gpus


def node_pool(pool: InferencePool) -> dict[str, Any]:
    """The NodePool manifest; raises ``ValueError`` when ``spec.nodePool`` is not enabled."""
    np = pool.spec.node_pool
    if not np.enabled or np.node_class_ref is None:
        raise ValueError("spec.nodePool.enabled is false or nodeClassRef is missing")
    requirements = [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [c.value for c in np.capacity_types]},
        *[r.model_dump(mode="json", exclude_none=True) for r in np.requirements],
    ]
    limits: dict[str, Any] = dict(np.limits)
    if pool.spec.server.gpus and GPU_RESOURCE not in limits:
        limits[GPU_RESOURCE] = gpu_limit(pool)
    template_spec: dict[str, Any] = {
        "nodeClassRef": np.node_class_ref.model_dump(mode="json"),
        "requirements": requirements,
        "expireAfter": np.expire_after,
    }
    if np.taint_gpu_nodes:
        template_spec["taints"] = [{"key": GPU_RESOURCE, "value": "true", "effect": "NoSchedule"}]
    disruption = np.disruption.model_dump(mode="json", exclude_none=True)
    for budget in disruption["budgets"]:
        if not budget.get("reasons"):
            # Karpenter applies `reasons: []` to no reason at all; absent means every reason.
            budget.pop("reasons", None)
    spec: dict[str, Any] = {
        "template": {
            "metadata": {"labels": {**names.common_labels(pool), names.LABEL_NAMESPACE: pool.metadata.namespace}},
            "spec": template_spec,
        },
        "disruption": disruption,
        "limits": limits,
    }
    if np.weight is not None:
        spec["weight"] = np.weight
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {
            "name": names.node_pool_name(pool),
            "labels": {**names.common_labels(pool), names.LABEL_NAMESPACE: pool.metadata.namespace},
        },
        "spec": spec,
    }


def stamp_template(manifest: dict[str, Any], existing: Mapping[str, Any] | None, now_s: float) -> dict[str, Any]:
    """``manifest`` (a NodePool) with annotations saying when its ``spec.template`` last changed.

    ``tidegate.dev/template-hash``: a hash of ``spec.template`` (requirements, node class, taints: what
    decides which instance types Karpenter may launch); ``tidegate.dev/template-changed-at``: RFC 3339,
    kept from ``existing`` (the live NodePool) while the hash is the same, else ``now_s`` (epoch
    seconds). What Karpenter said of the NodePool before that time is about a template since changed
    (:func:`tidegate.operator.karpenter.template_changed_s`). NodePool metadata is not part of
    Karpenter's drift hash (``karpenter.sh/nodepool-hash`` covers ``spec.template``), so nodes never
    drift on these annotations.
    """
    digest = hashlib.sha256(json.dumps(manifest["spec"]["template"], sort_keys=True).encode()).hexdigest()[:16]
    old = ((existing or {}).get("metadata") or {}).get("annotations") or {}
    changed = old.get(names.ANNOTATION_TEMPLATE_CHANGED)
    if old.get(names.ANNOTATION_TEMPLATE_HASH) != digest or not changed:
        changed = datetime.datetime.fromtimestamp(int(now_s), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    annotations = {names.ANNOTATION_TEMPLATE_HASH: digest, names.ANNOTATION_TEMPLATE_CHANGED: changed}
    return {**manifest, "metadata": {**manifest["metadata"], "annotations": annotations}}
