"""What a ScaledObject trigger asks for: the pool, and its ``spec.scaling`` flattened into metadata.

KEDA passes the trigger's whole ``metadata`` map (strings only) in every call as
``ScaledObjectRef.scalerMetadata`` (KEDA 2.17 ``pkg/scalers/external_scaler.go``). The operator writes::

    triggers:
    - type: external
      metadata:
        scalerAddress: tidegate-scaler.tidegate-system:9090
        pool: small                      # required: the InferencePool's name
        namespace: team-a                # optional: defaults to the ScaledObject's namespace
        sidecarPort: "8081"              # optional: the admission sidecar's port (stats endpoint)
        minReplicas: "1"                 # optional from here on: spec.scaling, camelCase, as strings
        maxReplicas: "8"
        targetCapacityRejectRate: "0.02"
        targetUtilization: "0.85"
        maxScaleUpStep: "4"
        scaleDownCooldownSeconds: "180"
        pollingIntervalSeconds: "15"     # how long utilisation must stay high: half of it (the law)
        windowSeconds: "60"              # spec.scaling.signal.windowSeconds
        warmPoolSize: "1"                # spec.warmPool.size (which warm-labelled pods are on their way to serve)
        source: sidecar                  # or prometheus (spec.scaling.signal.source)
        prometheusUrl: http://prometheus.monitoring:9090

Everything comes from the metadata, so GetMetricSpec never needs a backend and any scaler
replica can answer any call. Unknown keys are ignored (KEDA adds its own, e.g. ``scalerAddress``).
Errors: :class:`~tidegate.scaler.errors.MetadataError` naming the offending key.
"""

import re
from dataclasses import dataclass
from typing import Any

import pydantic

from tidegate.api.scaling import ScalingSpec
from tidegate.scaler.errors import MetadataError, UnknownMetricError

DEFAULT_SIDECAR_PORT = 8081  # the operator's default (TIDEGATE_SIDECAR_PORT), which also writes sidecarPort
METRIC_SUFFIX = "desired-replicas"
_INT_KEYS = ("minReplicas", "maxReplicas", "maxScaleUpStep", "scaleDownCooldownSeconds", "pollingIntervalSeconds")
_FLOAT_KEYS = ("targetCapacityRejectRate", "targetUtilization")
_SIGNAL_KEYS = {"windowSeconds": int, "source": str, "prometheusUrl": str}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_KEDA_INDEX = re.compile(r"^s\d+-")


@dataclass(frozen=True)
class Target:
    """One pool to scale, as a trigger describes it."""

    namespace: str
    pool: str
    scaling: ScalingSpec
    sidecar_port: int = DEFAULT_SIDECAR_PORT
    warm_pool_size: int | None = None  # spec.warmPool.size; None: a trigger written without it

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.pool)

    @property
    def metric_name(self) -> str:
        """The one metric this trigger serves (KEDA prefixes it with ``s<index>-`` for the HPA)."""
        return f"tidegate-{self.pool}-{METRIC_SUFFIX}"

    def check_metric_name(self, name: str) -> None:
        """Accept our metric name, with or without KEDA's ``s<index>-`` prefix; else UnknownMetricError."""
        if name and _KEDA_INDEX.sub("", name, count=1) != self.metric_name and name != self.metric_name:
            raise UnknownMetricError(
                f"unknown metric {name!r} for pool {self.pool}: this scaler serves {self.metric_name!r}"
            )


def _name(metadata: dict[str, str], key: str, default: str) -> str:
    value = metadata.get(key, default).strip()
    if not value:
        raise MetadataError(key, "is required (the InferencePool's name)" if key == "pool" else "is required")
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise MetadataError(
            key, f"{value!r} is not a Kubernetes name (lowercase letters, digits, '-', '.'; at most 63)"
        )
    return value


def _convert(key: str, raw: str, kind: type) -> Any:
    try:
        return kind(raw.strip())
    except ValueError:
        raise MetadataError(key, f"{raw!r} is not {'an integer' if kind is int else 'a number'}") from None


def parse(name: str, namespace: str, metadata: dict[str, str]) -> Target:
    """The :class:`Target` of a ``ScaledObjectRef`` (its name, namespace and scalerMetadata).

    Raises :class:`MetadataError` (key and reason) for a missing ``pool``, a missing namespace,
    a value of the wrong type, or a spec the InferencePool validation would refuse.
    """
    pool = _name(metadata, "pool", "")
    ns = _name(metadata, "namespace", namespace)
    fields: dict[str, Any] = {}
    for key in _INT_KEYS:
        if key in metadata:
            fields[key] = _convert(key, metadata[key], int)
    for key in _FLOAT_KEYS:
        if key in metadata:
            fields[key] = _convert(key, metadata[key], float)
    signal = {k: _convert(k, metadata[k], kind) for k, kind in _SIGNAL_KEYS.items() if k in metadata}
    if signal:
        fields["signal"] = signal
    try:
        spec = ScalingSpec.model_validate(fields)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"] if str(p) != "signal"]
        key = loc[-1] if loc else ("prometheusUrl" if "prometheus" in err["msg"] else "minReplicas")
        raise MetadataError(key, err["msg"].removeprefix("Value error, ")) from None
    port = _convert("sidecarPort", metadata["sidecarPort"], int) if "sidecarPort" in metadata else DEFAULT_SIDECAR_PORT
    if not 1 <= port <= 65535:
        raise MetadataError("sidecarPort", f"{port} is not a TCP port")
    warm = _convert("warmPoolSize", metadata["warmPoolSize"], int) if "warmPoolSize" in metadata else None
    if warm is not None and warm < 0:
        raise MetadataError("warmPoolSize", f"{warm} is negative")
    return Target(namespace=ns, pool=pool, scaling=spec, sidecar_port=port, warm_pool_size=warm)
