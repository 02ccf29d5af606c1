"""Autoscaling (``spec.scaling``) and the warm pool (``spec.warmPool``)."""

from enum import StrEnum

from pydantic import Field, model_validator

from tidegate.api.base import ApiModel, Fraction, cel, validations


class SignalSource(StrEnum):
    """Where the scaler reads the sidecars' admission counters.

    ``sidecar`` (default): scrape each pod's stats endpoint directly; no Prometheus needed.
    ``prometheus``: PromQL over ``tidegate_admission_decisions_total`` at ``prometheusUrl``.
    """

    SIDECAR = "sidecar"
    PROMETHEUS = "prometheus"


class SignalSpec(ApiModel):
    """Where the scaling signal comes from."""

    source: SignalSource = Field(default=SignalSource.SIDECAR, description="`sidecar` or `prometheus`.")
    prometheus_url: str | None = Field(
        default=None,
        max_length=2048,
        description="Prometheus base URL when source is `prometheus`, e.g. `http://prometheus.monitoring:9090`.",
    )
    window_seconds: int = Field(
        default=60, ge=10, le=3600, description="Window over which reject and admit rates are computed."
    )

    @model_validator(mode="after")
    def _url(self) -> "SignalSpec":
        if self.source is SignalSource.PROMETHEUS and not self.prometheus_url:
            raise ValueError("scaling.signal.prometheusUrl is required when source is prometheus")
        return self

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "self.source != 'prometheus' || has(self.prometheusUrl)",
                "scaling.signal.prometheusUrl is required when source is prometheus",
                ".prometheusUrl",
            )
        )
    }


class ScalingSpec(ApiModel):
    """How the tidegate scaler (through KEDA) sizes the pool's active replicas."""

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=10_000,
        description="Fewest active replicas, served even when spec.replicas is lower "
        "(no autoscaler running yet). 0 allows scale to zero when idle.",
    )
    max_replicas: int = Field(
        default=8, ge=1, le=10_000, description="Most active replicas (GPUs per replica x this bounds the pool's GPUs)."
    )
    target_capacity_reject_rate: Fraction = Field(
        default=0.02,
        description="Capacity rejections / capacity demand (0..1) above which the pool is saturated "
        "and scales out. Policy rejections (one tenant over quota) never count.",
    )
    target_utilization: float = Field(
        default=0.85,
        gt=0.0,
        le=1.0,
        description="Token-budget utilisation (0 exclusive..1) the pool is sized for, saturated or not. The default "
        "leaves 15 % of each replica's budget for a burst's first seconds; the warm pool is the rest of the headroom.",
    )
    max_scale_up_step: int = Field(default=4, ge=1, le=1000, description="Most replicas added in one decision.")
    scale_down_cooldown_seconds: int = Field(
        default=180,
        ge=0,
        le=86_400,
        description="Demand must stay lower this long before the scaler asks for fewer replicas. The HPA then "
        "applies a 60 s scale-down window (since the last higher answer) and removes at most one replica a minute.",
    )
    polling_interval_seconds: int = Field(
        default=15,
        ge=1,
        le=3600,
        description="KEDA pollingInterval for the external trigger, written only when minReplicas is 0 (KEDA's "
        "own loop decides 0 <-> 1; above 0 the HPA's sync period drives scaling); also the period of the "
        "HPA's scale-up step policy; and token utilisation over the band must last half of it before it buys a replica.",
    )
    signal: SignalSpec = Field(default_factory=SignalSpec, description="Where the scaler reads admission counters.")
    fallback_replicas: int | None = Field(
        default=None,
        ge=0,
        le=10_000,
        description="Replicas KEDA holds when the scaler fails repeatedly (KEDA `fallback`). "
        "Unset: KEDA keeps the current count.",
    )
    keda: bool = Field(
        default=True,
        description="Create a KEDA ScaledObject when KEDA's CRDs exist. false: scale by hand (`kubectl scale`).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> "ScalingSpec":
        if self.min_replicas > self.max_replicas:
            raise ValueError("scaling.minReplicas must be <= scaling.maxReplicas")
        if self.fallback_replicas is not None and self.fallback_replicas > self.max_replicas:
            raise ValueError("scaling.fallbackReplicas must be <= scaling.maxReplicas")
        return self

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "self.minReplicas <= self.maxReplicas",
                "scaling.minReplicas must be <= scaling.maxReplicas",
                ".minReplicas",
            ),
            cel(
                "!has(self.fallbackReplicas) || self.fallbackReplicas <= self.maxReplicas",
                "scaling.fallbackReplicas must be <= scaling.maxReplicas",
                ".fallbackReplicas",
            ),
        )
    }


class WarmPoolSpec(ApiModel):
    """Pre-loaded replicas kept beside the active ones, the scaler's headroom.

    Promotion (relabel to ``active``) takes seconds; a cold replica takes a node (90 s-4 min)
    plus a model load (45-120 s). With ``serve`` the warm replicas also take requests: the
    scaling law sizes the active replicas from the load of every serving replica, and the warm
    ones ride on top, so the GPUs they hold serve a burst from its first second.
    """

    size: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Warm (loaded) replicas kept beside the active ones. 0 disables the warm pool.",
    )
    serve: bool = Field(
        default=True,
        description="Warm replicas take requests too (they are in the Service, labelled "
        "tidegate.dev/serving=true); the scaler sizes the active replicas from the load of every "
        "serving replica and keeps the warm ones on top as headroom. false: warm replicas stay "
        "loaded and out of the Service until promoted.",
    )
