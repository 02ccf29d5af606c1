"""``status`` of an InferencePool: written by the operator (and KEDA reads ``replicas``/``selector``).

Every field the operator writes is declared here, because the API server prunes undeclared
status fields silently.
"""

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from tidegate.api.base import ApiModel, RawObject


class ConditionType(StrEnum):
    """Condition types the operator sets."""

    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    KEDA_READY = "KedaReady"
    NODE_POOL_READY = "NodePoolReady"
    SCALER_REACHABLE = "ScalerReachable"


class Condition(ApiModel):
    """A standard Kubernetes condition (same shape as ``metav1.Condition``)."""

    type: Annotated[str, Field(min_length=1, max_length=316, description="Condition type, e.g. `Ready`.")]
    status: Literal["True", "False", "Unknown"] = Field(description="`True`, `False` or `Unknown`.")
    reason: Annotated[str, Field(max_length=1024, description="CamelCase machine-readable reason.")] = ""
    message: Annotated[str, Field(max_length=32768, description="What happened and what to do.")] = ""
    last_transition_time: datetime | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="Generation this condition was computed for."
    )


class ScalingSignal(ApiModel):
    """The scaler's last decision, as the operator last saw it."""

    desired_replicas: int | None = Field(default=None, ge=0, description="Replicas the scaler asked for.")
    capacity_reject_rate: float | None = Field(
        default=None, ge=0, le=1, description="Capacity rejections / capacity demand (0..1) over the window."
    )
    policy_reject_rate: float | None = Field(
        default=None, ge=0, le=1, description="Policy rejections / all requests (0..1) over the window."
    )
    reason: str = Field(
        default="", max_length=1024, description="Why, e.g. `4 -> 6: capacity reject 31% across 5 tenants`."
    )
    time: datetime | None = Field(default=None, description="When the decision was made.")


class InferencePoolStatus(ApiModel):
    """Observed state of an InferencePool."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The spec generation the operator last reconciled."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=32,
        description="`Ready`, `Progressing`, `Degraded`, `KedaReady`, `NodePoolReady`, `ScalerReachable`.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    replicas: int = Field(default=0, ge=0, description="Active replicas; the /scale subresource's current count.")
    ready_replicas: int = Field(default=0, ge=0, description="Active replicas that are Ready.")
    warm_replicas: int = Field(
        default=0,
        ge=0,
        description="Ready, loaded warm replicas (not active); they take requests too when spec.warmPool.serve.",
    )
    selector: str = Field(
        default="", max_length=4096, description="Label selector of the pool's pods (for the HPA through /scale)."
    )
    capacity_reject_rate: float | None = Field(
        default=None, ge=0, le=1, description="Last capacity reject rate (0..1); the RejectRate column."
    )
    signal: ScalingSignal | None = Field(default=None, description="The scaler's last decision.")
    kopf: RawObject | None = Field(default=None, description="Bookkeeping of the kopf framework (handler progress).")
