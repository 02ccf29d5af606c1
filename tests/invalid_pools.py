"""Invalid InferencePools shared by the unit tier (pydantic) and the cluster tier (API server).

Each case breaks one rule of a valid pool and names the field a user must change. Both
validators must refuse every case, so the CEL rules on the CRD and the pydantic validators
cannot drift apart silently.
"""

import copy
from dataclasses import dataclass
from typing import Any


def valid_pool(name: str = "valid") -> dict[str, Any]:
    """A small valid pool (the shape of examples/minimal.yaml)."""
    return {
        "apiVersion": "tidegate.dev/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "server": {"image": "vllm/vllm-openai:v0.11.0"},
        },
    }


@dataclass(frozen=True)
class Case:
    id: str
    spec_patch: dict[str, Any]
    field: str  # dotted path the error must name, e.g. spec.scaling.minReplicas
    drop: tuple[str, ...] = ()  # top-level spec keys to remove


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def build(case: Case, name: str = "invalid") -> dict[str, Any]:
    pool = valid_pool(name)
    spec = copy.deepcopy(pool["spec"])
    _merge(spec, case.spec_patch)
    for key in case.drop:
        spec.pop(key)
    pool["spec"] = spec
    return pool


CASES = [
    Case("min-over-max", {"scaling": {"minReplicas": 5, "maxReplicas": 2}}, "spec.scaling.minReplicas"),
    Case(
        "kv-resume-not-below-trip",
        {"admission": {"kvCache": {"trip": 0.8, "resume": 0.9}}},
        "spec.admission.kvCache.resume",
    ),
    Case("gpu-memory-trip-over-one", {"admission": {"gpuMemory": {"trip": 1.2}}}, "spec.admission.gpuMemory.trip"),
    Case("utilization-over-one", {"scaling": {"targetUtilization": 1.5}}, "spec.scaling.targetUtilization"),
    Case("utilization-zero", {"scaling": {"targetUtilization": 0}}, "spec.scaling.targetUtilization"),
    Case(
        "reject-rate-negative", {"scaling": {"targetCapacityRejectRate": -0.1}}, "spec.scaling.targetCapacityRejectRate"
    ),
    Case("warm-pool-over-max", {"warmPool": {"size": 10}, "scaling": {"maxReplicas": 4}}, "spec.warmPool.size"),
    Case("replicas-not-a-number", {"replicas": "three"}, "spec.replicas"),
    Case("replicas-negative", {"replicas": -1}, "spec.replicas"),
    Case("unknown-engine", {"model": {"engine": "triton"}}, "spec.model.engine"),
    Case("node-pool-without-class", {"nodePool": {"enabled": True}}, "spec.nodePool.nodeClassRef"),
    # Karpenter v1.14.1 reads an empty list as no budget: every node disrupted at once
    Case("node-pool-no-budget", {"nodePool": {"disruption": {"budgets": []}}}, "spec.nodePool.disruption.budgets"),
    # Karpenter v1.14.1 refuses these NodePools: refused at apply, naming the pool's own field
    Case(
        "node-pool-limit-not-a-quantity", {"nodePool": {"limits": {"nvidia.com/gpu": "lots"}}}, "spec.nodePool.limits"
    ),
    Case(
        "node-pool-schedule-without-duration",
        {"nodePool": {"disruption": {"budgets": [{"nodes": "1", "schedule": "@daily"}]}}},
        "spec.nodePool.disruption.budgets",
    ),
    Case(
        "node-pool-budget-reason-twice",
        {"nodePool": {"disruption": {"budgets": [{"nodes": "1", "reasons": ["Empty", "Empty"]}]}}},
        "spec.nodePool.disruption.budgets",
    ),
    Case(
        "node-pool-limit-true",
        {"nodePool": {"limits": {"nvidia.com/gpu": True}}},
        "spec.nodePool.limits",
    ),
    Case(
        "node-pool-duration-in-seconds",
        {"nodePool": {"disruption": {"budgets": [{"nodes": "1", "schedule": "@daily", "duration": "30s"}]}}},
        "spec.nodePool.disruption.budgets",
    ),
    Case(
        "node-pool-restricted-key",
        {"nodePool": {"requirements": [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["x"]}]}},
        "spec.nodePool.requirements",
    ),
    Case(
        "node-pool-hostname-key",
        {"nodePool": {"requirements": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]}},
        "spec.nodePool.requirements",
    ),
    Case(
        "node-pool-karpenter-domain-key",
        {"nodePool": {"requirements": [{"key": "karpenter.sh/other", "operator": "Exists"}]}},
        "spec.nodePool.requirements",
    ),
    Case(
        "node-pool-in-without-values",
        {"nodePool": {"requirements": [{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In"}]}},
        "spec.nodePool.requirements",
    ),
    Case(
        "node-pool-min-values-over-values",
        {
            "nodePool": {
                "requirements": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["a"], "minValues": 2}
                ]
            }
        },
        "spec.nodePool.requirements",
    ),
    Case(
        "node-pool-gt-two-values",
        {
            "nodePool": {
                "requirements": [
                    {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt", "values": ["1", "2"]}
                ]
            }
        },
        "spec.nodePool.requirements",
    ),
    Case(
        "prometheus-without-url", {"scaling": {"signal": {"source": "prometheus"}}}, "spec.scaling.signal.prometheusUrl"
    ),
    Case(
        "default-class-unknown",
        {"admission": {"defaultPriorityClass": "realtime"}},
        "spec.admission.defaultPriorityClass",
    ),
    Case(
        "reserved-shares-over-one",
        {
            "admission": {
                "priorityClasses": [
                    {"name": "interactive", "ttftSloMs": 1000, "reservedShare": 0.7},
                    {"name": "batch", "ttftSloMs": 60000, "reservedShare": 0.5},
                ]
            }
        },
        "spec.admission.priorityClasses",
    ),
    Case(
        "breaker-cap-below-cooldown",
        {"admission": {"circuitBreaker": {"cooldownSeconds": 120, "maxCooldownSeconds": 60}}},
        "spec.admission.circuitBreaker.maxCooldownSeconds",
    ),
    Case(
        "api-key-without-secret",
        {"admission": {"tenancy": {"identity": "apiKey"}}},
        "spec.admission.tenancy.apiKeySecret",
    ),
    Case(
        "duplicate-tenants",
        {"admission": {"tenancy": {"tenants": [{"name": "a"}, {"name": "a", "weight": 2}]}}},
        "spec.admission.tenancy.tenants",
    ),
    Case(
        "tenant-name-with-comma",
        {"admission": {"tenancy": {"tenants": [{"name": "acme, globex"}]}}},
        "spec.admission.tenancy.tenants",  # the API server says tenants[0].name
    ),
    Case(
        "budget-below-context",
        {"model": {"maxContextTokens": 32768}, "admission": {"tokenBudget": 16384}},
        "spec.admission.tokenBudget",
    ),
    Case("server-without-image", {"server": {"image": None, "port": 8000}}, "spec.server.image"),
    Case("fallback-over-max", {"scaling": {"maxReplicas": 4, "fallbackReplicas": 6}}, "spec.scaling.fallbackReplicas"),
    Case("model-missing", {}, "spec.model", drop=("model",)),
    Case("unknown-field", {"scaling": {"maxReplica": 4}}, "spec.scaling.maxReplica"),
]
