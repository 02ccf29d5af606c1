"""Deployment ``<pool>``: the model server plus the ``tidegate-admission`` sidecar in every pod.

Pod shape:

- ``model`` container: the user's server (image, args, env, volumes, GPUs as
  ``nvidia.com/gpu``), a startup probe on its health path (model load can take minutes), a
  readiness probe on the same path, and a ``preStop`` that asks the sidecar to drain and waits.
- ``tidegate-admission``: a native sidecar (init container with ``restartPolicy: Always``, so
  it starts before and stops after the model server), Pod Security ``restricted``-clean,
  reading its config from the ``<pool>-admission`` ConfigMap and its role from a downward-API
  labels file.
- Pods start with ``role=warm``; the operator relabels them (``warm_pool``). The role is not in
  the Deployment's selector, so relabelling never orphans a pod.

Pod readiness means "model loaded and sidecar healthy" (not "active"): a warm pod must be
Ready to count as warm. Traffic follows the ``tidegate.dev/serving`` label through the Service
selector; the operator writes it on the pods, never in this template, so flipping
``spec.warmPool.serve`` rolls no pod. The sidecar itself refuses traffic unless its role is
``active``, or ``warm`` labelled serving.

The preStop drain runs whatever the role, so a serving warm pod the ReplicaSet deletes (the warm
pool shrank, or a drained pod found it full) refuses new requests and finishes those in flight
within the termination grace, as an active one does; pod-deletion-cost still orders draining <
warm < active.
"""

from typing import Any

from tidegate.api import constants
from tidegate.api.admission import TenantIdentitySource
from tidegate.api.pool import InferencePool
from tidegate.operator import names
from tidegate.operator.settings import OperatorSettings

GPU_RESOURCE = "nvidia.com/gpu"
TERMINATION_SLACK_S = 30


def _gpu_toleration() -> dict[str, Any]:
    return {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def _model_container(pool: InferencePool, settings: OperatorSettings) -> dict[str, Any]:
    server = pool.spec.server
    resources: dict[str, Any] = {k: dict(v) for k, v in server.resources.items()}
    if server.gpus:
        for kind in ("requests", "limits"):
            resources.setdefault(kind, {})[GPU_RESOURCE] = server.gpus
    probe_http = {"path": server.health_path, "port": server.port}
    container: dict[str, Any] = {
        "name": names.MODEL_CONTAINER,
        "image": server.image,
        "ports": [{"name": "model", "containerPort": server.port, "protocol": "TCP"}],
        "startupProbe": {
            "httpGet": probe_http,
            "periodSeconds": 5,
            "failureThreshold": max(1, server.startup_timeout_seconds // 5),
        },
        "readinessProbe": {"httpGet": probe_http, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": probe_http, "periodSeconds": 15, "failureThreshold": 4, "timeoutSeconds": 5},
        "lifecycle": {
            # Blocks until the sidecar has refused new work and finished what is in flight
            # (bounded by the termination grace), so SIGTERM never cuts a generation short.
            "preStop": {"httpGet": _drain_hook(pool, settings)}
        },
    }
    if server.command:
        container["command"] = list(server.command)
    if server.args:
        container["args"] = list(server.args)
    if server.env:
        container["env"] = [dict(e) for e in server.env]
    if resources:
        container["resources"] = resources
    if server.volume_mounts:
        container["volumeMounts"] = [dict(m) for m in server.volume_mounts]
    if server.security_context:
        container["securityContext"] = dict(server.security_context)
    return container


def _api_key_secret(pool: InferencePool) -> str | None:
    """The Secret of API-key digests to mount when tenants are identified by API key."""
    tenancy = pool.spec.admission.tenancy
    return tenancy.api_key_secret if tenancy.identity is TenantIdentitySource.API_KEY else None


def _drain_hook(pool: InferencePool, settings: OperatorSettings) -> dict[str, Any]:
    hook: dict[str, Any] = {"path": "/tidegate/drain?wait=true", "port": settings.sidecar_port}
    if token := names.drain_token(pool):
        hook["httpHeaders"] = [{"name": names.DRAIN_TOKEN_HEADER, "value": token}]
    return hook


def _sidecar(pool: InferencePool, settings: OperatorSettings) -> dict[str, Any]:
    port = settings.sidecar_port
    sidecar = {
        "name": names.SIDECAR_CONTAINER,
        "image": settings.sidecar_image,
        "restartPolicy": "Always",  # native sidecar (Kubernetes >= 1.29)
        "args": [
            "admission",
            "--config",
            f"{names.CONFIG_DIR}/{names.CONFIG_FILE}",
            "--upstream",
            f"http://127.0.0.1:{pool.spec.server.port}",
            "--listen",
            f"0.0.0.0:{port}",
            "--labels-file",
            f"{names.PODINFO_DIR}/labels",
        ],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
        "ports": [{"name": "admission", "containerPort": port, "protocol": "TCP"}],
        # Ready only once the sidecar knows the replica's budget (read from the model server, or set):
        # a pod is never promoted into the Service to answer 503 not_active while it sizes itself
        "readinessProbe": {"httpGet": {"path": "/tidegate/ready", "port": port}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 10, "failureThreshold": 3},
        "resources": {
            "requests": {"cpu": settings.sidecar_cpu, "memory": settings.sidecar_memory},
            "limits": {"memory": settings.sidecar_memory},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "tidegate-admission-config", "mountPath": names.CONFIG_DIR, "readOnly": True},
            {"name": "tidegate-podinfo", "mountPath": names.PODINFO_DIR, "readOnly": True},
        ],
    }
    if _api_key_secret(pool):
        sidecar["args"] += ["--api-keys-dir", names.API_KEYS_DIR]
        sidecar["volumeMounts"].append({"name": "tidegate-api-keys", "mountPath": names.API_KEYS_DIR, "readOnly": True})
    return sidecar


def scheduling(pool: InferencePool) -> dict[str, Any]:
    """``nodeSelector`` and ``tolerations`` of the pool's pods (shared with the NodePool builder).

    GPU pods tolerate the common ``nvidia.com/gpu:NoSchedule`` taint; with a tidegate NodePool
    they are pinned to it through ``karpenter.sh/nodepool``.
    """
    spec = pool.spec
    selector = dict(spec.server.node_selector)
    tolerations = [dict(t) for t in spec.server.tolerations]
    if spec.node_pool.enabled:
        selector["karpenter.sh/nodepool"] = names.node_pool_name(pool)
    if (
        spec.server.gpus or (spec.node_pool.enabled and spec.node_pool.taint_gpu_nodes)
    ) and _gpu_toleration() not in tolerations:
        tolerations.append(_gpu_toleration())
    return {"nodeSelector": selector, "tolerations": tolerations}


def deployment(pool: InferencePool, settings: OperatorSettings, replicas: int) -> dict[str, Any]:
    """The Deployment manifest (``apps/v1``) with ``replicas`` pods (active + warm + draining).

    ``replicas`` comes from :func:`tidegate.operator.warm_pool.plan`, not from the spec alone,
    because draining pods stay until their requests finish.
    """
    spec = pool.spec
    grace = spec.admission.request_timeout_seconds + TERMINATION_SLACK_S
    pod_labels = {**names.common_labels(pool), constants.LABEL_ROLE: constants.ROLE_WARM}
    template_meta: dict[str, Any] = {"labels": pod_labels, "annotations": {}}
    base_spec: dict[str, Any] = {}
    if spec.server.pod_template:
        base_meta = spec.server.pod_template.get("metadata") or {}
        template_meta["labels"] = {**(base_meta.get("labels") or {}), **pod_labels}
        template_meta["annotations"] = dict(base_meta.get("annotations") or {})
        base_spec = dict(spec.server.pod_template.get("spec") or {})
    template_meta["annotations"][names.ANNOTATION_DELETION_COST] = str(names.COST_WARM)

    model = _model_container(pool, settings)
    containers = [dict(c) for c in base_spec.get("containers") or []]
    if containers:
        index = next((i for i, c in enumerate(containers) if c.get("name") == names.MODEL_CONTAINER), 0)
        containers[index] = {**containers[index], **{k: v for k, v in model.items() if v is not None}}
    else:
        containers = [model]

    sched = scheduling(pool)
    pod_spec: dict[str, Any] = {
        **base_spec,
        "containers": containers,
        "initContainers": [*(base_spec.get("initContainers") or []), _sidecar(pool, settings)],
        "terminationGracePeriodSeconds": max(grace, base_spec.get("terminationGracePeriodSeconds") or 0),
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, **(base_spec.get("securityContext") or {})},
        "volumes": [
            *(base_spec.get("volumes") or []),
            *[dict(v) for v in spec.server.volumes],
            {"name": "tidegate-admission-config", "configMap": {"name": names.config_map_name(pool)}},
            {
                "name": "tidegate-podinfo",
                "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
            },
        ],
    }
    if secret := _api_key_secret(pool):
        pod_spec["volumes"].append({"name": "tidegate-api-keys", "secret": {"secretName": secret}})
    if sched["nodeSelector"]:
        pod_spec["nodeSelector"] = {**(base_spec.get("nodeSelector") or {}), **sched["nodeSelector"]}
    if sched["tolerations"]:
        pod_spec["tolerations"] = [*(base_spec.get("tolerations") or []), *sched["tolerations"]]

    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": pool.metadata.name,
            "namespace": pool.metadata.namespace,
            "labels": names.common_labels(pool),
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": names.selector_labels(pool)},
            # One extra pod at a time during rollouts; never fewer serving than asked for.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "progressDeadlineSeconds": spec.server.startup_timeout_seconds + 60,
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }
