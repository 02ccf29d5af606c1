"""The closed set of admission outcomes and rejection reasons.

Every rejection has exactly one reason, and every reason belongs to exactly one class:

- **capacity**: the replica (or the pool) has no room: token budget, concurrency, queue full,
  queue timeout, KV-cache pressure, GPU memory, circuit open, SLO unreachable. The scaler
  counts these as unmet demand: capacity rejections buy GPUs.
- **policy**: the request or its tenant is the problem: tenant concurrency, tenant rate,
  request too large, bad request, unauthorized, replica not active. These never buy GPUs.

Pure: no I/O.
"""

from enum import StrEnum


class Outcome(StrEnum):
    """What admission decided for one request."""

    ADMIT = "admit"
    ADMIT_DEMOTED = "admit_demoted"  # over its fair share while capacity exists: queued behind others
    REJECT = "reject"


class ReasonClass(StrEnum):
    """Whether a rejection is unmet capacity (scale out) or policy (do not)."""

    CAPACITY = "capacity"
    POLICY = "policy"


class Reason(StrEnum):
    """Why a request was rejected (the ``reason`` label of ``tidegate_admission_decisions_total``)."""

    # capacity
    TOKEN_BUDGET = "token_budget"
    CONCURRENCY = "concurrency"
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    KV_PRESSURE = "kv_pressure"
    GPU_MEMORY = "gpu_memory"
    CIRCUIT_OPEN = "circuit_open"
    SLO_UNREACHABLE = "slo_unreachable"
    # policy
    TENANT_CONCURRENCY = "tenant_concurrency"
    TENANT_RATE = "tenant_rate"
    REQUEST_TOO_LARGE = "request_too_large"
    BAD_REQUEST = "bad_request"
    UNAUTHORIZED = "unauthorized"
    NOT_ACTIVE = "not_active"

    @property
    def reason_class(self) -> ReasonClass:
        """The class of this reason (capacity or policy)."""
        return ReasonClass.CAPACITY if self in CAPACITY_REASONS else ReasonClass.POLICY


CAPACITY_REASONS = frozenset(
    {
        Reason.TOKEN_BUDGET,
        Reason.CONCURRENCY,
        Reason.QUEUE_FULL,
        Reason.QUEUE_TIMEOUT,
        Reason.KV_PRESSURE,
        Reason.GPU_MEMORY,
        Reason.CIRCUIT_OPEN,
        Reason.SLO_UNREACHABLE,
    }
)
POLICY_REASONS = frozenset(Reason) - CAPACITY_REASONS
