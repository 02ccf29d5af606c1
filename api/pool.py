"""The InferencePool resource: spec (desired) and the whole object."""

from typing import Annotated

from pydantic import Field, model_validator

from tidegate.api.admission import AdmissionSpec
from tidegate.api.base import ApiModel, cel, validations
from tidegate.api.constants import API_VERSION, KIND
from tidegate.api.nodepool import NodePoolSpec
from tidegate.api.scaling import ScalingSpec, WarmPoolSpec
from tidegate.api.serving import ModelSpec, ServerSpec
from tidegate.api.status import InferencePoolStatus


class InferencePoolSpec(ApiModel):
    """Desired state of an InferencePool.

    ``replicas`` is the number of **active** (serving) replicas and is exposed through the
    ``/scale`` subresource: once KEDA drives the pool it belongs to the autoscaler (leave it out
    of GitOps sources, or ignore its drift).
    """

    replicas: int = Field(
        default=1,
        ge=0,
        le=10_000,
        description="Active (serving) replicas. Set by KEDA/HPA or `kubectl scale` through /scale. "
        "The operator serves it held within scaling.minReplicas..maxReplicas: below minReplicas it serves "
        "minReplicas (the Ready condition says so), above maxReplicas it serves maxReplicas (Degraded says so).",
    )
    model: ModelSpec = Field(description="The model served.")
    server: ServerSpec = Field(description="The model-server container.")
    admission: AdmissionSpec = Field(default_factory=AdmissionSpec, description="Per-replica admission control.")
    warm_pool: WarmPoolSpec = Field(
        default_factory=WarmPoolSpec, description="Pre-loaded replicas promoted in seconds."
    )
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, description="Autoscaling from the capacity reject rate.")
    node_pool: NodePoolSpec = Field(
        default_factory=NodePoolSpec, description="Optional Karpenter NodePool for the GPUs."
    )

    @model_validator(mode="after")
    def _cross(self) -> "InferencePoolSpec":
        if self.warm_pool.size > self.scaling.max_replicas:
            raise ValueError("warmPool.size must be <= scaling.maxReplicas")
        budget = self.admission.token_budget
        if budget is not None and budget < self.model.max_context_tokens:
            raise ValueError(
                "admission.tokenBudget must be >= model.maxContextTokens (one full-context request must fit)"
            )
        return self

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "self.warmPool.size <= self.scaling.maxReplicas",
                "warmPool.size must be <= scaling.maxReplicas",
                ".warmPool.size",
            ),
            cel(
                "!has(self.admission.tokenBudget) || self.admission.tokenBudget >= self.model.maxContextTokens",
                "admission.tokenBudget must be >= model.maxContextTokens (one full-context request must fit)",
                ".admission.tokenBudget",
            ),
        )
    }


class ObjectMeta(ApiModel):
    """The part of ``metadata`` tidegate reads; everything else is kept as written."""

    model_config = ApiModel.model_config | {"extra": "allow"}

    name: Annotated[str, Field(min_length=1, max_length=253)]
    namespace: str = "default"
    generation: int | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class InferencePool(ApiModel):
    """A whole InferencePool object as read from the API server or a YAML file."""

    api_version: str = Field(default=API_VERSION, alias="apiVersion")
    kind: str = Field(default=KIND)
    metadata: ObjectMeta
    spec: InferencePoolSpec
    status: InferencePoolStatus = Field(default_factory=InferencePoolStatus)


__all__ = ["InferencePool", "InferencePoolSpec", "ObjectMeta"]
