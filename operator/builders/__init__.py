"""Pure desired-state builders: one function per child object, ``InferencePool -> manifest dict``.

No I/O and no Kubernetes client: handlers apply what these return. Every builder is
deterministic, so applying its output twice changes nothing (level-triggered reconciling).
"""

from tidegate.operator.builders.configmap import admission_config_map
from tidegate.operator.builders.deployment import deployment
from tidegate.operator.builders.nodepool import node_pool, stamp_template
from tidegate.operator.builders.scaled_object import scaled_object
from tidegate.operator.builders.service import pod_disruption_budget, service

__all__ = [
    "admission_config_map",
    "deployment",
    "node_pool",
    "pod_disruption_budget",
    "scaled_object",
    "service",
    "stamp_template",
]
