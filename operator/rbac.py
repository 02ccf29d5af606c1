"""The operator's RBAC: the one definition of what it may do (the chart renders this same list).

Least privilege: no Secrets, no cluster-wide writes except Karpenter NodePools (which are
cluster-scoped by design), no pod creation (the Deployment controller creates pods; the
operator only relabels them).
"""

from typing import Any

from tidegate.api import GROUP, PLURAL

ALL_WRITE = ["get", "list", "watch", "create", "update", "patch", "delete"]
READ = ["get", "list", "watch"]

RULES: list[dict[str, Any]] = [
    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch", "update"]},
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch", "update"]},
    # blockOwnerDeletion on children needs update on the owner's finalizers subresource.
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/finalizers"], "verbs": ["update"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["services", "configmaps"], "verbs": ALL_WRITE},
    # list: Karpenter's FailedScheduling Events on the pool's pods say why no node is launched.
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "list"]},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": READ},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ALL_WRITE},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ALL_WRITE},
    {"apiGroups": ["keda.sh"], "resources": ["scaledobjects"], "verbs": ALL_WRITE},
    {
        "apiGroups": ["autoscaling"],
        "resources": ["horizontalpodautoscalers"],
        "verbs": ["get", "list", "watch", "delete"],
    },
    {"apiGroups": ["karpenter.sh"], "resources": ["nodepools"], "verbs": ALL_WRITE},
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": READ},
]


def cluster_role(name: str = "tidegate-operator") -> dict[str, Any]:
    """The ClusterRole manifest (``rbac.authorization.k8s.io/v1``)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "tidegate", "app.kubernetes.io/component": "operator"},
        },
        "rules": RULES,
    }


def cluster_role_binding(namespace: str, service_account: str, name: str = "tidegate-operator") -> dict[str, Any]:
    """Binds :func:`cluster_role` to the operator's ServiceAccount."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }
