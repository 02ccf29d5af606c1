"""Operator settings: one typed object, parsed once from the environment (chart values set them).

Environment variables (all optional):

===============================  ==========================================  =========================
variable                         meaning                                     default
===============================  ==========================================  =========================
TIDEGATE_SIDECAR_IMAGE           image of the admission sidecar              ghcr.io/tidegate/tidegate:0.1.0
TIDEGATE_SIDECAR_PORT            port the sidecar listens on in each pod     8081
TIDEGATE_SIDECAR_CPU             sidecar cpu request (and limit x4)          250m
TIDEGATE_SIDECAR_MEMORY          sidecar memory request and limit            256Mi
TIDEGATE_SCALER_ADDRESS          host:port of the tidegate scaler (gRPC)     tidegate-scaler.tidegate:9090
TIDEGATE_RESYNC_SECONDS          periodic full reconcile                     30
TIDEGATE_DRAIN_TIMEOUT_SECONDS   most a draining pod waits before it leaves  pool's requestTimeoutSeconds
TIDEGATE_GPU_PENDING_SECONDS     a pod unschedulable this long (no GPU node, 120
                                 a selector nothing matches) -> Degraded
                                 with the scheduler's message
TIDEGATE_REQUIRE_SCALER          create ScaledObjects only when the scaler   true
                                 answers gRPC health checks
TIDEGATE_SCALER_PROBE_TTL_S      how long a scaler health result is cached   10
TIDEGATE_SCALER_DECISIONS_URL    the scaler's side port (``/decisions``):    unset: status.signal
                                 status.signal, RejectRate, Events           stays empty
TIDEGATE_SCALER_TLS              the scaler serves gRPC over TLS: triggers   false
                                 get enableTLS and an authenticationRef
TIDEGATE_SCALER_AUTH_NAME        that (Cluster)TriggerAuthentication's name  tidegate-scaler-tls
TIDEGATE_SCALER_AUTH_KIND        TriggerAuthentication (in each pool's       TriggerAuthentication
                                 namespace) or ClusterTriggerAuthentication
TIDEGATE_SCALER_CA_FILE          CA bundle the operator's health probe       system roots
                                 trusts
TIDEGATE_SCALER_CLIENT_CERT_FILE client certificate and key for the probe    none (no mTLS)
TIDEGATE_SCALER_CLIENT_KEY_FILE  when the scaler requires mTLS
TIDEGATE_METRICS_PORT            port of the operator's Prometheus           0 (not served)
                                 ``/metrics`` (tidegate_pool_condition)
===============================  ==========================================  =========================
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorSettings:
    """Settings of one operator process (see the module docstring for the environment mapping)."""

    sidecar_image: str = "ghcr.io/tidegate/tidegate:0.1.0"
    sidecar_port: int = 8081
    sidecar_cpu: str = "250m"
    sidecar_memory: str = "256Mi"
    scaler_address: str = "tidegate-scaler.tidegate:9090"
    resync_seconds: float = 30.0
    drain_timeout_seconds: float | None = None
    gpu_pending_seconds: float = 120.0
    require_scaler: bool = True
    scaler_probe_ttl_seconds: float = 10.0
    scaler_decisions_url: str | None = None
    scaler_tls: bool = False
    scaler_auth_name: str = "tidegate-scaler-tls"
    scaler_auth_kind: str = "TriggerAuthentication"
    scaler_ca_file: str | None = None
    scaler_client_cert_file: str | None = None
    scaler_client_key_file: str | None = None
    metrics_port: int = 0
    field_manager: str = "tidegate-operator"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "OperatorSettings":
        """Parse settings from ``env`` (default ``os.environ``).

        Raises ``ValueError`` naming the variable when a value does not parse.
        """
        env = os.environ if env is None else env
        kwargs: dict[str, object] = {}

        def take(var: str, field: str, parse: type | object = str) -> None:
            if var in env and env[var] != "":
                try:
                    kwargs[field] = parse(env[var])  # type: ignore[operator]
                except ValueError as exc:
                    raise ValueError(f"{var}={env[var]!r}: {exc}") from exc

        take("TIDEGATE_SIDECAR_IMAGE", "sidecar_image")
        take("TIDEGATE_SIDECAR_PORT", "sidecar_port", int)
        take("TIDEGATE_SIDECAR_CPU", "sidecar_cpu")
        take("TIDEGATE_SIDECAR_MEMORY", "sidecar_memory")
        take("TIDEGATE_SCALER_ADDRESS", "scaler_address")
        take("TIDEGATE_RESYNC_SECONDS", "resync_seconds", float)
        take("TIDEGATE_DRAIN_TIMEOUT_SECONDS", "drain_timeout_seconds", float)
        take("TIDEGATE_GPU_PENDING_SECONDS", "gpu_pending_seconds", float)
        take("TIDEGATE_REQUIRE_SCALER", "require_scaler", _parse_bool)
        take("TIDEGATE_SCALER_PROBE_TTL_S", "scaler_probe_ttl_seconds", float)
        take("TIDEGATE_SCALER_DECISIONS_URL", "scaler_decisions_url")
        take("TIDEGATE_SCALER_TLS", "scaler_tls", _parse_bool)
        take("TIDEGATE_SCALER_AUTH_NAME", "scaler_auth_name")
        take("TIDEGATE_SCALER_AUTH_KIND", "scaler_auth_kind", _auth_kind)
        take("TIDEGATE_SCALER_CA_FILE", "scaler_ca_file")
        take("TIDEGATE_SCALER_CLIENT_CERT_FILE", "scaler_client_cert_file")
        take("TIDEGATE_SCALER_CLIENT_KEY_FILE", "scaler_client_key_file")
        take("TIDEGATE_METRICS_PORT", "metrics_port", int)
        return cls(**kwargs)  # type: ignore[arg-type]


def _parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _auth_kind(value: str) -> str:
    if value not in ("TriggerAuthentication", "ClusterTriggerAuthentication"):
        raise ValueError("expected TriggerAuthentication or ClusterTriggerAuthentication")
    return value
