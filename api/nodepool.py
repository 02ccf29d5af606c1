"""The Karpenter NodePool a pool's GPUs come from (``spec.nodePool``), ``karpenter.sh/v1``.

Source of field meanings: https://karpenter.sh/docs/concepts/nodepools/
"""

import re
from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from tidegate.api.base import ApiModel, Quantity, cel, validations


class CapacityType(StrEnum):
    """``karpenter.sh/capacity-type`` values."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"
    RESERVED = "reserved"


class ConsolidationPolicy(StrEnum):
    """When Karpenter may remove or replace this pool's nodes."""

    WHEN_EMPTY = "WhenEmpty"
    WHEN_EMPTY_OR_UNDERUTILIZED = "WhenEmptyOrUnderutilized"
    BALANCED = "Balanced"  # Karpenter v1.14.1 has it; an older Karpenter refuses the NodePool (ApiRefused)


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
    GTE = "Gte"  # Karpenter v1.14.1 has them; an older Karpenter refuses the NodePool (ApiRefused)
    LTE = "Lte"


class NodeClassRef(ApiModel):
    """The cloud-specific node class (e.g. ``karpenter.k8s.aws/EC2NodeClass``); group and kind are immutable in Karpenter."""

    group: Annotated[str, Field(min_length=1, max_length=253, description="API group, e.g. `karpenter.k8s.aws`.")]
    kind: Annotated[str, Field(min_length=1, max_length=63, description="Kind, e.g. `EC2NodeClass`.")]
    name: Annotated[str, Field(min_length=1, max_length=253, description="Name of the node class object.")]


# Label keys Karpenter v1.14.1 refuses in a NodePool's requirements: its CRD
# (pkg/apis/crds/karpenter.sh_nodepools.yaml, the key's x-kubernetes-validations) restricts the domain
# karpenter.sh but for karpenter.sh/capacity-type, and the labels karpenter.sh/nodepool and
# kubernetes.io/hostname (Karpenter sets both on each node). v1.14.1 restricts no other domain
# (pkg/apis/v1/labels.go, RestrictedLabelDomains), so neither does tidegate.
_KARPENTER_KEYS = ("karpenter.sh/capacity-type", "karpenter.sh/nodepool")
_DOMAIN = 'self.find("^([^/]+)")'
# (CEL over the key, the same test in Python over the key, message)
_KEY_RULES = (
    (
        "self != 'karpenter.sh/nodepool'",
        lambda key: key != "karpenter.sh/nodepool",
        "requirements: the label \"karpenter.sh/nodepool\" is Karpenter's own (each node carries its NodePool's name)",
    ),
    (
        "self != 'kubernetes.io/hostname'",
        lambda key: key != "kubernetes.io/hostname",
        'requirements: the label "kubernetes.io/hostname" is restricted (each node gets its own)',
    ),
    (
        f"self in {list(_KARPENTER_KEYS)} || !{_DOMAIN}.endsWith('karpenter.sh')",
        lambda key: key in _KARPENTER_KEYS or not key.split("/", 1)[0].endswith("karpenter.sh"),
        'requirements: Karpenter restricts the label domain "karpenter.sh" (but for karpenter.sh/capacity-type; '
        "tidegate sets it from nodePool.capacityTypes)",
    ),
)
# What Karpenter v1.14.1's CRD refuses of a requirement's values (the requirements list's
# x-kubernetes-validations), and no more: a pool stored before a rule existed must stay writable
# (scale, status, finalizer), so tidegate adds no rule of its own here. ``values`` may be absent
# (``has``): a rule that reads an absent field is an error, not a refusal, and is not ratcheted.
# Gt/Lt/Gte/Lte: an integer below 9e18 (leading zeros allowed), so it always fits Karpenter's int64
# (its CEL ``int()``) and the rule never errors; Karpenter also takes 9e18 up to 2^63-1.
_VALUES_RULES = (
    (
        "self.operator != 'In' || (has(self.values) && size(self.values) > 0)",
        lambda r: r.operator != "In" or len(r.values) > 0,
        "requirements: operator In needs at least one value",
    ),
    (
        "!(self.operator in ['Gt', 'Lt', 'Gte', 'Lte']) || "
        "(has(self.values) && size(self.values) == 1 && self.values[0].matches('^0*([0-9]{1,18}|[1-8][0-9]{18})$'))",
        lambda r: (
            r.operator not in _COMPARISONS
            or (len(r.values) == 1 and bool(re.fullmatch(r"0*([0-9]{1,18}|[1-8][0-9]{18})", r.values[0])))
        ),
        "requirements: operators Gt, Lt, Gte and Lte need exactly one value, a non-negative integer",
    ),
    (
        "self.operator != 'In' || !has(self.minValues) || (has(self.values) && size(self.values) >= self.minValues)",
        lambda r: r.operator != "In" or r.min_values is None or len(r.values) >= r.min_values,
        "requirements: with operator In, minValues may not exceed the number of values",
    ),
)
_COMPARISONS = ("Gt", "Lt", "Gte", "Lte")

LabelValue = Annotated[str, Field(max_length=63, pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")]
"""A label value (Kubernetes': at most 63 characters, alphanumeric at both ends)."""


class Requirement(ApiModel):
    """A node selector requirement, e.g. ``karpenter.k8s.aws/instance-gpu-name In [h100]``.

    Refused at ``kubectl apply`` rather than later on the NodePool: what Karpenter v1.14.1's CRD
    refuses (a key in the domain karpenter.sh but karpenter.sh/capacity-type, the key
    kubernetes.io/hostname, ``In`` without values or with fewer than ``minValues``, ``Gt``/``Lt``/``Gte``/``Lte``
    without exactly one non-negative integer), and nothing more.
    """

    key: Annotated[
        str,
        Field(
            min_length=1,
            max_length=316,
            pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(\/))?([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$",
            description="Node label key, e.g. `karpenter.k8s.aws/instance-gpu-name`.",
            json_schema_extra=validations(*(cel(rule, message) for rule, _, message in _KEY_RULES)),
        ),
    ]
    operator: RequirementOperator = Field(
        description="`In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`, `Gte`, `Lte` (the last two need a "
        "Karpenter that has them, e.g. v1.14.1)."
    )
    values: list[LabelValue] = Field(
        default_factory=list,
        max_length=64,
        description="Values for In/NotIn; one integer for Gt/Lt/Gte/Lte; none for Exists/DoesNotExist.",
    )
    min_values: int | None = Field(
        default=None,
        ge=1,
        le=50,
        description="Karpenter's `minValues` (alpha there): at least this many distinct values of the key among "
        "the instance types it may launch, e.g. 5 instance types for spot flexibility; with `In`, at most as "
        "many as `values`.",
    )

    @field_validator("key")
    @classmethod
    def _unrestricted(cls, key: str) -> str:
        for _, allowed, message in _KEY_RULES:
            if not allowed(key):
                raise ValueError(message)
        return key

    @model_validator(mode="after")
    def _values_fit_operator(self) -> "Requirement":
        for _, allowed, message in _VALUES_RULES:
            if not allowed(self):
                raise ValueError(message)
        return self

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(*(cel(rule, message, ".values") for rule, _, message in _VALUES_RULES))
    }


_SCHEDULE_WITH_DURATION = "budgets: schedule and duration go together (Karpenter refuses one without the other)"


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
        description="`Underutilized`, `Empty`, `Drifted`, each at most once; absent: every reason. An empty list is "
        "read as absent (the NodePool leaves `reasons` out: Karpenter applies a budget whose list is empty to no "
        "reason at all).",
        # a set in Karpenter's NodePool (x-kubernetes-list-type: set): a repeat is refused there, so here too
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @field_validator("reasons")
    @classmethod
    def _reasons_once(cls, reasons: list[DisruptionReason] | None) -> list[DisruptionReason] | None:
        if reasons is not None and len(set(reasons)) != len(reasons):
            raise ValueError("budgets: a reason may appear once (Karpenter's reasons are a set)")
        return reasons

    schedule: str | None = Field(
        default=None,
        max_length=128,
        # Karpenter v1.14.1's pattern is looser (it anchors only the first branch); this one asks for five fields,
        # separated by ASCII white space as in the API server's RE2 (not Python's Unicode \s)
        pattern=r"^(@(annually|yearly|monthly|weekly|daily|midnight|hourly)|[^ \t\n\f\r]+([ \t\n\f\r]+[^ \t\n\f\r]+){4})$",
        description="Cron schedule (five fields, or `@daily` and the like; UTC) when the budget becomes active; "
        "needs `duration`.",
    )
    duration: str | None = Field(
        default=None,
        pattern=r"^((([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?)$",
        description="How long after each `schedule` hit it is active, in minutes and hours (e.g. `8h`, `1h30m`); "
        "needs `schedule`.",
    )

    @model_validator(mode="after")
    def _schedule_with_duration(self) -> "DisruptionBudget":
        if (self.schedule is None) != (self.duration is None):
            raise ValueError(_SCHEDULE_WITH_DURATION)
        return self

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(cel("has(self.schedule) == has(self.duration)", _SCHEDULE_WITH_DURATION))
    }


class DisruptionSpec(ApiModel):
    """Karpenter disruption settings for GPU nodes (conservative by default: model loads are expensive)."""

    consolidation_policy: ConsolidationPolicy = Field(
        default=ConsolidationPolicy.WHEN_EMPTY,
        description="`WhenEmpty` (default), `WhenEmptyOrUnderutilized` or `Balanced` (the last needs a Karpenter "
        "that has it, e.g. v1.14.1).",
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
    limits: dict[str, Quantity] = Field(
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
