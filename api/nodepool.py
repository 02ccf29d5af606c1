"""The Karpenter NodePool a pool's GPUs come from (``spec.nodePool``), ``karpenter.sh/v1``.

Source of field meanings: https://karpenter.sh/docs/concepts/nodepools/
"""

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from tidegate.api.base import ApiModel, IntOrString, cel, validations


class CapacityType(StrEnum):
    """``karpenter.sh/capacity-type`` values."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"
    RESERVED = "reserved"


class ConsolidationPolicy(StrEnum):
    """When Karpenter may remove or replace this pool's nodes."""

    WHEN_EMPTY = "WhenEmpty"
    WHEN_EMPTY_OR_UNDERUTILIZED = "WhenEmptyOrUnderutilized"


class DisruptionReason(StrEnum):
    """What a disruption budget can be limited to (Karpenter's `DisruptionReason` enum)."""

    UNDERUTILIZED = "Underutilized"
    EMPTY = "Empty"
    DRIFTED = "Drifted"


class RequirementOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


class NodeClassRef(ApiModel):
    """The cloud-specific node class (e.g. ``karpenter.k8s.aws/EC2NodeClass``); group and kind are immutable in Karpenter."""

    group: Annotated[str, Field(min_length=1, max_length=253, description="API group, e.g. `karpenter.k8s.aws`.")]
    kind: Annotated[str, Field(min_length=1, max_length=63, description="Kind, e.g. `EC2NodeClass`.")]
    name: Annotated[str, Field(min_length=1, max_length=253, description="Name of the node class object.")]


class Requirement(ApiModel):
    """A node selector requirement, e.g. ``karpenter.k8s.aws/instance-gpu-name In [h100]``."""

    key: Annotated[str, Field(min_length=1, max_length=316, description="Node label key.")]
    operator: RequirementOperator = Field(description="`In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`.")
    values: list[str] = Field(
        default_factory=list, max_length=64, description="Values for In/NotIn; one integer for Gt/Lt."
    )


class DisruptionBudget(ApiModel):
    """A Karpenter disruption budget: how many nodes may be disrupted at once."""

    # Karpenter v1 applies a budget to a disruption reason only when the budget's `reasons` is
    # absent or names it, so `reasons: []` limits nothing (sigs.k8s.io/karpenter v1.14.1,
    # pkg/apis/v1/nodepool.go, GetAllowedDisruptionsByReason). Here an empty list keeps the meaning
    # tidegate gave it before (pools stored with the old default `reasons: []`): every reason; the
    # builder leaves the field out.

    nodes: str = Field(
        default="10%",
        pattern=r"^((100|[0-9]{1,2})%|[0-9]+)$",
        description="Count or percentage of nodes, e.g. `1` or `10%`.",
    )
    reasons: list[DisruptionReason] | None = Field(
        default=None,
        max_length=3,
        description="`Underutilized`, `Empty`, `Drifted`; absent: every reason. An empty list is read as absent "
        "(the NodePool leaves `reasons` out: Karpenter applies a budget whose list is empty to no reason at all).",
    )
    schedule: str | None = Field(default=None, max_length=128, description="Cron schedule when the budget is active.")
    duration: str | None = Field(
        default=None, pattern=r"^([0-9]+(s|m|h))+$", description="How long after `schedule` it is active, e.g. `8h`."
    )


class DisruptionSpec(ApiModel):
    """Karpenter disruption settings for GPU nodes (conservative by default: model loads are expensive)."""

    consolidation_policy: ConsolidationPolicy = Field(
        default=ConsolidationPolicy.WHEN_EMPTY, description="`WhenEmpty` (default) or `WhenEmptyOrUnderutilized`."
    )
    consolidate_after: str = Field(
        default="10m",
        pattern=r"^(([0-9]+(s|m|h))+|Never)$",
        description="Idle time before a node may be consolidated, e.g. `10m`, or `Never`.",
    )
    budgets: list[DisruptionBudget] = Field(
        default_factory=lambda: [DisruptionBudget(nodes="1")],
        min_length=1,
        max_length=50,
        description="Disruption budgets; leave the field out for the default, one node at a time. At least one: "
        "Karpenter reads an empty list as no budget at all (every node may be disrupted at once).",
    )


class NodePoolSpec(ApiModel):
    """A Karpenter NodePool ``tidegate-<namespace>-<pool>`` made for this pool's GPU nodes."""

    enabled: bool = Field(
        default=False, description="Create a Karpenter NodePool for this pool (needs Karpenter's CRDs)."
    )
    node_class_ref: NodeClassRef | None = Field(
        default=None, description="Required when enabled: the node class to launch from."
    )
    requirements: list[Requirement] = Field(
        default_factory=list, max_length=32, description="Extra node requirements, e.g. GPU name or memory."
    )
    capacity_types: list[CapacityType] = Field(
        default_factory=lambda: [CapacityType.ON_DEMAND],
        min_length=1,
        max_length=3,
        description="Allowed `karpenter.sh/capacity-type` values.",
    )
    limits: dict[str, IntOrString] = Field(
        default_factory=dict,
        description="Most resources the NodePool may provision, e.g. `{nvidia.com/gpu: 16}`. Leave room "
        "for max replicas + warm pool + surge, or replicas stay Pending. Empty: `nvidia.com/gpu` = (maxReplicas + "
        "warmPool.size + 1) x GPUs per replica; Karpenter counts all the GPUs of each node it launches, so set it "
        "when instance types have more GPUs than a replica uses.",
    )
    taint_gpu_nodes: bool = Field(
        default=True, description="Taint nodes `nvidia.com/gpu=true:NoSchedule` (pool pods tolerate it)."
    )
    expire_after: str = Field(
        default="720h",
        pattern=r"^(([0-9]+(s|m|h))+|Never)$",
        description="Node lifetime before replacement, or `Never`.",
    )
    weight: int | None = Field(default=None, ge=1, le=100, description="NodePool priority among NodePools (1-100).")
    disruption: DisruptionSpec = Field(
        default_factory=DisruptionSpec, description="Consolidation and disruption budgets."
    )

    @model_validator(mode="after")
    def _class_ref(self) -> "NodePoolSpec":
        if self.enabled and self.node_class_ref is None:
            raise ValueError("nodePool.nodeClassRef is required when nodePool.enabled is true")
        return self

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "!self.enabled || has(self.nodeClassRef)",
                "nodePool.nodeClassRef is required when nodePool.enabled is true",
                ".nodeClassRef",
            )
        )
    }
