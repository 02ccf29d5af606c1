"""KEDA ScaledObject ``<pool>`` (``keda.sh/v1alpha1``) driving the pool's ``/scale``.

The trigger is ``external`` at the tidegate scaler, which returns the desired replica count
as the metric; with ``metricType: AverageValue`` and a target of 1 the HPA lands exactly
there (the HPA's algorithm for an ``AverageValue`` metric, desired = ceil(metric / target): Kubernetes
"Horizontal Pod Autoscaling", algorithm details; KEDA 2.17 "Scaling Deployments", ``metricType``). Traps guarded:

- ``minReplicaCount`` is ``scaling.minReplicas``; the warm pool is outside ``spec.replicas``, so
  neither a scaler outage nor KEDA's cooldown can drain warm capacity.
- ``pollingInterval``, ``cooldownPeriod`` and ``initialCooldownPeriod`` are written only when
  ``minReplicaCount`` is 0: above it, KEDA's own loop never scales (the HPA does, on the
  controller-manager's sync period) and KEDA's admission webhook warns on every apply that the
  fields are "not relevant" (KEDA v2.21.0 ``apis/keda/v1alpha1/scaledobject_webhook.go``,
  ``verifyScaledObjects``). At 0, ``initialCooldownPeriod`` covers the expected cold start
  (``server.startupTimeoutSeconds``), so a new pool is not scaled to zero while its first
  replica is still loading.
- ``fallback`` only when ``scaling.fallbackReplicas`` is set (KEDA counts GetMetrics failures).

Source: https://keda.sh/docs/latest/reference/scaledobject-spec/
"""

from typing import Any

from tidegate.api import API_VERSION, KIND
from tidegate.api.pool import InferencePool
from tidegate.operator import names
from tidegate.operator.settings import OperatorSettings

METRIC_TYPE = "AverageValue"
SCALE_DOWN_WINDOW_S = 60
"""The HPA's scale-down stabilisation window in the ScaledObject (the HPA's own default is 300 s).

The law already waits ``scaleDownCooldownSeconds`` of lower demand before it answers lower, so the
HPA's window only has to ride out a dip of the law's answer while replicas load mid-spike (they are
not active yet: tests/unit/simulate/test_findings.py). The HPA's default on top of the cooldown made
every scale-down wait both, 10 minutes by default: simulator, seeds 0-2, GPU-hours 300 s -> 60 s
steady 1.67 -> 1.60, spike 3.59 -> 3.09, replica-lost 2.35 -> 2.08, attainment within 0.25 points."""


def trigger_metadata(pool: InferencePool, settings: OperatorSettings) -> dict[str, str]:
    """The external trigger's metadata (KEDA passes it to every scaler RPC as ``scalerMetadata``).

    ``spec.scaling`` travels flattened (camelCase keys, string values; the format
    ``tidegate.scaler.metadata`` parses), with ``spec.warmPool.size`` as ``warmPoolSize`` (which
    not-yet-Ready pods are loading to serve rather than refilling the warm pool: with
    ``minReplicas: 0`` they keep IsActive true), so any scaler replica answers any call without
    reading the pool: GetMetricSpec stays static, as KEDA's fallback needs.
    """
    scaling = pool.spec.scaling
    metadata = {
        "scalerAddress": settings.scaler_address,
        "pool": pool.metadata.name,
        "namespace": pool.metadata.namespace,
        "sidecarPort": str(settings.sidecar_port),
        "minReplicas": str(scaling.min_replicas),
        "maxReplicas": str(scaling.max_replicas),
        "targetCapacityRejectRate": str(scaling.target_capacity_reject_rate),
        "targetUtilization": str(scaling.target_utilization),
        "maxScaleUpStep": str(scaling.max_scale_up_step),
        "scaleDownCooldownSeconds": str(scaling.scale_down_cooldown_seconds),
        "pollingIntervalSeconds": str(scaling.polling_interval_seconds),
        "windowSeconds": str(scaling.signal.window_seconds),
        "source": scaling.signal.source.value,
        "warmPoolSize": str(pool.spec.warm_pool.size),
    }
    if scaling.signal.prometheus_url:
        metadata["prometheusUrl"] = scaling.signal.prometheus_url
    if settings.scaler_tls:
        metadata["enableTLS"] = "true"  # the CA (and client cert) come from the authenticationRef
    return metadata


def scaled_object(pool: InferencePool, settings: OperatorSettings) -> dict[str, Any]:
    """The ScaledObject manifest for ``pool``."""
    scaling = pool.spec.scaling
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": pool.metadata.name},
        "minReplicaCount": scaling.min_replicas,
        "maxReplicaCount": scaling.max_replicas,
        "advanced": {
            "horizontalPodAutoscalerConfig": {
                "behavior": {
                    "scaleUp": {
                        "stabilizationWindowSeconds": 0,
                        "selectPolicy": "Max",
                        "policies": [
                            {
                                "type": "Pods",
                                "value": scaling.max_scale_up_step,
                                "periodSeconds": scaling.polling_interval_seconds,
                            }
                        ],
                    },
                    "scaleDown": {
                        # SCALE_DOWN_WINDOW_S: scale-down takes the law's cooldown plus up to this.
                        "stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S,
                        "selectPolicy": "Min",
                        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                    },
                }
            }
        },
        "triggers": [
            {
                "type": "external",
                "name": "tidegate",
                "metricType": METRIC_TYPE,
                "metadata": trigger_metadata(pool, settings),
            }
        ],
    }
    if scaling.min_replicas == 0:
        # KEDA's own loop decides 0 <-> 1 (IsActive) only here; see the module docstring.
        spec["pollingInterval"] = scaling.polling_interval_seconds
        spec["cooldownPeriod"] = max(scaling.scale_down_cooldown_seconds, 30)
        spec["initialCooldownPeriod"] = pool.spec.server.startup_timeout_seconds
    if settings.scaler_tls:
        # KEDA takes caCert / tlsClientCert / tlsClientKey only from a (Cluster)TriggerAuthentication.
        spec["triggers"][0]["authenticationRef"] = {
            "name": settings.scaler_auth_name,
            "kind": settings.scaler_auth_kind,
        }
    if scaling.fallback_replicas is not None:
        spec["fallback"] = {"failureThreshold": 3, "replicas": scaling.fallback_replicas}
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": pool.metadata.name,
            "namespace": pool.metadata.namespace,
            "labels": names.common_labels(pool),
        },
        "spec": spec,
    }
