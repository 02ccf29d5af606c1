"""Admission-control settings (``spec.admission``): what each replica's sidecar admits.

Decision order in the sidecar (README, "Admission sidecar"): circuit breaker -> system gate (KV cache, GPU
memory) -> tenant policy -> replica capacity with a weighted-fair queue -> forward. Every
threshold here is per replica.
"""

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from tidegate.api.base import LIST_MAP_BY_NAME, ApiModel, Fraction, Name, cel, validations

FALLBACK_TOKEN_BUDGET = 65_536
"""Per-replica token budget when ``tokenBudget`` is unset and the model server reports no capacity."""
FALLBACK_MAX_CONCURRENCY = 64
"""Per-replica concurrency when ``maxConcurrency`` is unset and the model server reports no capacity."""
VLLM_DEFAULT_MAX_NUM_SEQS = 256
"""vLLM's default ``--max-num-seqs`` for the OpenAI server (``EngineArgs``, vllm/engine/arg_utils.py; V1
raises it to 1024 on GPUs of 70 GiB and more other than A100): vLLM does not publish its own value."""


class StalePolicy(StrEnum):
    """What the system gate does when backend telemetry is older than ``staleAfterSeconds``.

    ``failOpen``: ignore the gate (admission still bounds tokens and concurrency).
    ``failClosed``: refuse as if under pressure until fresh telemetry arrives.
    """

    FAIL_OPEN = "failOpen"
    FAIL_CLOSED = "failClosed"


class QueueSpec(ApiModel):
    """The bounded, weighted-fair queue in front of the replica's token budget."""

    max_depth: int = Field(
        default=128,
        ge=0,
        le=100_000,
        description="Requests that may wait; 0 disables queueing (refuse at once when full).",
    )
    max_wait_ms: int = Field(
        default=10_000,
        ge=0,
        le=600_000,
        description="Longest a request may wait in the queue before it is refused (`queue_timeout`). "
        "It waits no longer than its class TTFT SLO less the backend TTFT measured for the class either, "
        "and a request whose predicted start is later than that is refused at once (`slo_unreachable`).",
    )


class HysteresisGate(ApiModel):
    """A gate that trips above ``trip`` and resumes only below ``resume`` (both 0..1)."""

    enabled: bool = Field(default=True, description="Whether this gate is evaluated.")
    trip: Fraction = Field(description="Usage (0..1) at or above which new requests are refused.")
    resume: Fraction = Field(description="Usage (0..1) below which admission resumes after a trip. Must be < trip.")

    @model_validator(mode="after")
    def _resume_below_trip(self) -> "HysteresisGate":
        if self.resume >= self.trip:
            raise ValueError("resume must be < trip (hysteresis)")
        return self

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel("self.resume < self.trip", "resume must be < trip (hysteresis)", ".resume")
        )
    }


class KvCacheGate(HysteresisGate):
    """KV-cache usage gate, read from the backend (vLLM ``vllm:kv_cache_usage_perc``, 0..1)."""

    trip: Fraction = Field(
        default=0.92, description="KV-cache usage (0..1) at or above which new requests are refused (`kv_pressure`)."
    )
    resume: Fraction = Field(
        default=0.85, description="KV-cache usage (0..1) below which admission resumes. Must be < trip."
    )


class GpuMemoryGate(HysteresisGate):
    """GPU memory gate, read through NVML (``nvmlDeviceGetMemoryInfo``) where a GPU is visible."""

    trip: Fraction = Field(
        default=0.98, description="GPU memory used / total (0..1) at or above which new requests are refused."
    )
    resume: Fraction = Field(
        default=0.95, description="GPU memory fraction below which admission resumes. Must be < trip."
    )


class BackendQueueGate(ApiModel):
    """Hold new work back while the model server queues requests in its own queue.

    Read from the engine's metrics: vLLM ``vllm:num_requests_waiting``, llama.cpp
    ``llamacpp:requests_deferred``, TGI ``tgi_queue_size``. While more than ``maxQueued`` wait
    there, new requests wait in the sidecar's weighted-fair queue (refused by its deadlines with
    ``queue_full`` / ``queue_timeout`` / ``slo_unreachable``) instead of joining the engine's
    first-come-first-served queue.
    """

    enabled: bool = Field(default=True, description="Whether the model server's own queue holds dispatch.")
    max_queued: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="Requests the model server may queue itself before the sidecar holds new work back. "
        "0 keeps its queue empty; TGI batches by design from a non-empty queue (`waiting_served_ratio`), "
        "so a few per replica can suit it.",
    )


class TelemetrySpec(ApiModel):
    """How the sidecar polls the backend's metrics, and what stale data means."""

    poll_interval_ms: int = Field(default=500, ge=50, le=60_000, description="Backend metrics poll period.")
    stale_after_seconds: float = Field(default=10.0, gt=0, le=600, description="Telemetry older than this is stale.")
    on_stale: StalePolicy = Field(
        default=StalePolicy.FAIL_OPEN, description="`failOpen` or `failClosed` when telemetry is stale."
    )


class CircuitBreakerSpec(ApiModel):
    """Per-replica circuit breaker on backend latency and errors (closed / open / half-open).

    Opens when the recent TTFT of streamed responses exceeds ``latencyMultiplier`` x the baseline of the prefill
    work each met (its prompt plus the prompts still prefilling ahead of it; a busy replica or a long prompt is
    compared with what that much work took when healthy) and the tightest class TTFT SLO (non-streamed responses
    have no TTFT and never trip on latency), the error ratio exceeds
    ``errorRatio``, or nothing in flight makes token progress; stays open ``cooldownSeconds`` (doubling on each re-open up to
    ``maxCooldownSeconds``); then lets ``halfOpenRequests`` through and closes if at least
    ``halfOpenSuccessRatio`` of them succeed within the latency bound.
    """

    enabled: bool = Field(default=True, description="Whether the breaker is evaluated.")
    latency_multiplier: float = Field(
        default=3.0,
        gt=1.0,
        le=100.0,
        description="Open when the recent TTFT of streamed responses > this x their baseline TTFT and above "
        "the tightest class TTFT SLO. The baseline is per amount of prefill work a request met (its prompt "
        "tokens plus those still prefilling ahead of it, in buckets doubling from 128 tokens), learned from "
        "healthy responses: a replica slow for its load trips, one merely busy or serving long prompts does "
        "not (load is the adaptive budget's business). Non-streamed "
        "responses have no TTFT and are not compared (their end-to-end time depends on output length and load); "
        "they count for the error ratio and the stall detector.",
    )
    error_ratio: Fraction = Field(
        default=0.5, description="Open when the share (0..1) of failed backend responses in the window exceeds this."
    )
    min_samples: int = Field(
        default=20,
        ge=1,
        le=10_000,
        description="Responses needed in the window before the breaker may open on errors; for "
        "the latency trip, healthy responses per prefill-work bucket before responses in that bucket are judged.",
    )
    window_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="Sliding window for latency and error ratio."
    )
    cooldown_seconds: float = Field(
        default=60.0, gt=0, le=3600, description="First open period; doubles on each re-open."
    )
    max_cooldown_seconds: float = Field(default=300.0, gt=0, le=86_400, description="Cap on the doubled open period.")
    half_open_requests: int = Field(default=5, ge=1, le=1000, description="Trial requests let through when half-open.")
    half_open_success_ratio: Fraction = Field(
        default=0.8, description="Share (0..1) of trial requests that must succeed to close."
    )

    @model_validator(mode="after")
    def _cooldown_cap(self) -> "CircuitBreakerSpec":
        if self.max_cooldown_seconds < self.cooldown_seconds:
            raise ValueError("circuitBreaker.maxCooldownSeconds must be >= cooldownSeconds")
        return self

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "self.maxCooldownSeconds >= self.cooldownSeconds",
                "circuitBreaker.maxCooldownSeconds must be >= cooldownSeconds",
                ".maxCooldownSeconds",
            )
        )
    }


class AdaptiveBudgetSpec(ApiModel):
    """The adaptive token budget: moves with measured backend TTFT against the class SLOs (on by default).

    Its base is the budget the replica would otherwise use: ``tokenBudget`` when set, else the model
    server's own capacity (see ``AdmissionSpec.tokenBudget``). Every ``windowSeconds`` the sidecar
    takes the p95 of (backend TTFT / the request's class TTFT SLO) over the window. Above 1 (SLO
    missed): budget x (1 - ``step``). Below ``growBelow`` while the budget was at least 80% used:
    budget x (1 + ``step``). Between the two (a dead band): no change. Always within ``minRatio`` ..
    ``maxRatio`` x the base; fewer than 20 samples in a window: no change. Backend TTFT is measured
    from forwarding, so time queued in the sidecar never shrinks the budget: a burst held back by
    admission does not collapse it.
    """

    enabled: bool = Field(default=True, description="Whether the budget adapts (off: the base budget is fixed).")
    window_seconds: float = Field(
        default=60.0, ge=30.0, le=3600.0, description="Smoothing window and the least time between two moves."
    )
    step: float = Field(default=0.1, gt=0.0, le=0.5, description="Relative size of one move (0.1 = 10%).")
    grow_below: Fraction = Field(
        default=0.5, description="Grow while the TTFT p95 is under this fraction of the SLO (0..1)."
    )
    min_ratio: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="Lowest budget, as a fraction of the base (`tokenBudget` or the engine's).",
    )
    max_ratio: float = Field(
        default=2.0,
        ge=1.0,
        le=10.0,
        description="Highest budget, as a multiple of the base (`tokenBudget` or the engine's).",
    )


class PriorityClass(ApiModel):
    """A class of service with its own TTFT SLO, e.g. ``interactive`` or ``batch``."""

    name: Name = Field(description="Class name clients send in the priority header.")
    ttft_slo_ms: int = Field(
        ge=1,
        le=3_600_000,
        description="Time-to-first-token objective, from arrival at the sidecar to the first streamed token. "
        "The queue deadline of this class is this less the class's measured backend TTFT (smoothed + 4 deviations), "
        "so a request the queue admits can still meet it.",
    )
    reserved_share: Fraction = Field(
        default=0.0,
        description="Share (0..1) of the replica's token budget (and of its concurrency) only this class may use: "
        "the other classes fill the replica only up to the rest, even while this class uses more than its share, "
        "so a burst of this class always finds room.",
    )
    weight: float = Field(default=1.0, gt=0, le=1000, description="Weight in the fair queue relative to other classes.")


def _default_priority_classes() -> list[PriorityClass]:
    return [
        PriorityClass(name="interactive", ttft_slo_ms=2_000, reserved_share=0.3, weight=4.0),
        PriorityClass(name="batch", ttft_slo_ms=60_000, reserved_share=0.0, weight=1.0),
    ]


class TenantIdentitySource(StrEnum):
    """Where a request's tenant comes from (a trust decision, see ``TenancySpec``)."""

    NONE = "none"
    HEADER = "header"
    API_KEY = "apiKey"


class UnlistedTenants(StrEnum):
    """How tenant names not listed in ``tenancy.tenants`` are policed (see ``TenancySpec``)."""

    SHARED = "shared"
    SEPARATE = "separate"


class TenantPolicy(ApiModel):
    """Limits and fair-share weight of one tenant."""

    weight: float = Field(
        default=1.0, gt=0, le=1000, description="Fair-queueing weight: share of capacity under contention."
    )
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Requests in flight at once (held until the response ends). Unset: no cap.",
    )
    tokens_per_second: float | None = Field(
        default=None, gt=0, description="Sustained token rate (prompt + reserved output). Unset: no rate limit."
    )
    burst_tokens: int | None = Field(
        default=None, ge=1, description="Token bucket size. Unset: 10 s of `tokensPerSecond`."
    )
    max_in_flight_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Reserved tokens (prompt + output) this tenant may hold per replica at once, queued "
        "or running: its share of the KV cache, so one tenant's long contexts cannot evict everyone "
        "else's. Unset: only the replica's token budget bounds it.",
    )


class Tenant(TenantPolicy):
    """A named tenant with its own policy."""

    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=128,
            pattern=r"^[^,]+$",
            description="Tenant identity as it arrives (header value, or the name mapped from an API key). "
            "No commas: a header value with a comma is a list that a proxy merged, and is refused.",
        ),
    ]


class TenancySpec(ApiModel):
    """Tenant identity and per-tenant policy.

    Identity is a trust decision. ``header``: trust a header set by a gateway in front; only
    safe when clients cannot reach the pool's Service directly. ``apiKey``: the request's
    ``Authorization: Bearer`` key, mapped to a tenant by SHA-256 hash through the Secret
    ``apiKeySecret`` (keys: tenant names; values: hex digests, one per line); an unknown key is
    a 401. ``none``: every request is tenant ``default``.

    Unlisted tenants (``unlistedTenants``): ``shared`` (default) admits every name not in
    ``tenants`` under the ``default`` policy as *one* tenant: one concurrency count, one token
    bucket, one in-flight token count and one fair-queue weight for all of them together, so a
    client that rotates the header value cannot escape the default quota; metrics and stats still
    label by the name sent (within ``metricsTopTenants``). ``separate``: each unlisted name gets its
    own copy of ``default``; only safe when a trusted gateway sets the header.

    A request without the header (or with an empty value) in ``header`` mode is the tenant
    ``default``, exactly as a client that sends ``default`` itself; ``requireIdentity`` refuses it
    instead (400, ``param`` = the header name, a policy ``bad_request``).
    """

    identity: TenantIdentitySource = Field(
        default=TenantIdentitySource.NONE, description="`none`, `header` or `apiKey`."
    )
    header: str = Field(
        default="x-tenant-id",
        min_length=1,
        max_length=128,
        description="Header carrying the tenant when identity is `header`; absent or empty: the tenant "
        "`default`, unless `requireIdentity` refuses it.",
    )
    api_key_secret: str | None = Field(
        default=None, max_length=253, description="Secret mapping API-key hashes to tenants when identity is `apiKey`."
    )
    require_identity: bool = Field(
        default=False,
        description="In `header` mode, refuse a request without the header (or with an empty value) with "
        "400 naming the header, instead of serving it as the tenant `default` (which a client can also "
        "name itself by sending `default`).",
    )
    default: TenantPolicy = Field(
        default_factory=TenantPolicy,
        description="Policy of tenants not listed in `tenants` (how they share it: `unlistedTenants`).",
    )
    unlisted_tenants: UnlistedTenants = Field(
        default=UnlistedTenants.SHARED,
        description="`shared`: every tenant name not listed in `tenants` is admitted under `default` as one "
        "tenant (concurrency, tokens/s bucket, in-flight tokens and fair-queue weight shared by all of them "
        "together), so a client rotating the header value cannot escape the default quota; metrics still "
        "label by the name sent. `separate`: each unlisted name gets its own copy of `default`; only safe "
        "when a trusted gateway sets the header (clients could otherwise mint quotas by inventing names).",
    )
    tenants: list[Tenant] = Field(
        default_factory=list,
        max_length=1000,
        description="Tenants with their own policy; names are unique.",
        json_schema_extra=LIST_MAP_BY_NAME,
    )
    borrowing_cap: float = Field(
        default=1.5,
        ge=1.0,
        le=10.0,
        description="A tenant may borrow idle capacity up to this multiple of its fair share before "
        "its requests are demoted behind others.",
    )
    metrics_top_tenants: int = Field(
        default=20, ge=1, le=500, description="Tenants labelled by name in metrics; the rest are `other`."
    )

    @model_validator(mode="after")
    def _identity_config(self) -> "TenancySpec":
        if self.identity is TenantIdentitySource.API_KEY and not self.api_key_secret:
            raise ValueError("tenancy.apiKeySecret is required when tenancy.identity is apiKey")
        names = [t.name for t in self.tenants]
        if len(names) != len(set(names)):
            raise ValueError("tenancy.tenants names must be unique")
        return self

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "self.identity != 'apiKey' || has(self.apiKeySecret)",
                "tenancy.apiKeySecret is required when tenancy.identity is apiKey",
                ".apiKeySecret",
            ),
        )
    }


class AdmissionSpec(ApiModel):
    """Per-replica admission control: token budget, queue, gates, breaker, classes, tenants."""

    token_budget: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="Tokens (prompt + reserved output, over-reserved by `safetyFactor`) a replica may have in "
        "flight. Unset (the default): read from the model server, as the KV-cache tokens it reports: vLLM "
        "`vllm:cache_config_info` num_gpu_blocks x block_size, llama.cpp slots x n_ctx per slot (`/slots`, else "
        "`/props`; with `--kv-unified` the slots share one cache of `--ctx-size`: set this to it), TGI `max_batch_total_tokens` (`/info`, TGI 2.0 and older). Until it is read the sidecar is "
        "not ready and refuses with 503 `not_active`; if the model server answers healthy but reports no "
        "capacity within 30 s (engine `openai` at once) the replica runs on "
        f"{FALLBACK_TOKEN_BUDGET} tokens (at least `model.maxContextTokens`) and says so: a WARNING, "
        "`token_budget_source: fallback` and a `config_warnings` entry in its stats, "
        "`tidegate_admission_budget_fallback` 1. Read again when the model server restarts (it turns healthy "
        "again) and every 60 s: a server restarted with another shape resizes the replica at once, with a "
        "WARNING. A number overrides the engine.",
    )
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Requests a replica may have in flight. Unset (the default): the model server's own limit: "
        "llama.cpp slots (`--parallel`), TGI `max_concurrent_requests` (`/info`); vLLM does not report "
        f"`--max-num-seqs`, so its default {VLLM_DEFAULT_MAX_NUM_SEQS} is used (set this when you pass "
        f"`--max-num-seqs`); {FALLBACK_MAX_CONCURRENCY} when the model server reports no capacity "
        "(see `tokenBudget`). A number overrides the engine.",
    )
    safety_factor: float = Field(
        default=1.1,
        ge=1.0,
        le=4.0,
        description="Multiplier on estimated request cost; covers tokenizer estimate error.",
    )
    max_request_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        le=1024 * 1024 * 1024,
        description="Largest request body accepted (413 above).",
    )
    body_read_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Longest the sidecar waits for a request's whole body once its headers arrived. A client "
        "that sends its body too slowly (or stops) gets 408 and the connection is closed; nothing is reserved "
        "before the body is read.",
    )
    request_timeout_seconds: int = Field(
        default=600,
        ge=1,
        le=86_400,
        description="Longest a request may run end to end before the sidecar aborts and releases it. "
        "Pods get this plus 30 s of termination grace, so draining never cuts a generation short.",
    )
    max_prefill_tokens: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="Batch-composition control (off when unset): prompt tokens that may be in prefill at once "
        "(admitted, first token not yet produced), so one long prompt cannot stall the decodes of many short "
        "requests. A longer prompt waits for the prefills in progress to end, then runs alone.",
    )
    shed_after_multiple: float | None = Field(
        default=None,
        gt=1.0,
        le=1000.0,
        description="In-flight shedding (off when unset): a request running longer than this multiple of "
        "its predicted time (reserved tokens x the measured seconds per token) is aborted and released, "
        "and its client told to retry (503 + Retry-After, or an SSE error event once streaming).",
    )
    queue: QueueSpec = Field(default_factory=QueueSpec, description="Bounded weighted-fair queue.")
    kv_cache: KvCacheGate = Field(default_factory=KvCacheGate, description="KV-cache pressure gate (trip / resume).")
    gpu_memory: GpuMemoryGate = Field(
        default_factory=GpuMemoryGate, description="GPU memory gate via NVML, where a GPU is visible."
    )
    backend_queue: BackendQueueGate = Field(
        default_factory=BackendQueueGate,
        description="Hold new work in the sidecar's fair queue while the model server queues requests itself.",
    )
    telemetry: TelemetrySpec = Field(
        default_factory=TelemetrySpec, description="Backend metrics polling and staleness."
    )
    circuit_breaker: CircuitBreakerSpec = Field(
        default_factory=CircuitBreakerSpec, description="Latency/error circuit breaker."
    )
    adaptive_budget: AdaptiveBudgetSpec = Field(
        default_factory=AdaptiveBudgetSpec,
        description="Move the token budget with measured backend TTFT against the class SLOs (on by default).",
    )
    priority_header: str = Field(
        default="x-priority", min_length=1, max_length=128, description="Header naming the request's priority class."
    )
    default_priority_class: Name = Field(default="interactive", description="Class of requests that name none.")
    priority_classes: list[PriorityClass] = Field(
        default_factory=_default_priority_classes,
        min_length=1,
        max_length=16,
        description="Classes of service, names unique; default `interactive` (TTFT 2 s, 30% "
        "reserved) and `batch` (60 s).",
        json_schema_extra=LIST_MAP_BY_NAME,
    )
    tenancy: TenancySpec = Field(default_factory=TenancySpec, description="Tenant identity and per-tenant limits.")

    @model_validator(mode="after")
    def _classes(self) -> "AdmissionSpec":
        names = [c.name for c in self.priority_classes]
        if len(names) != len(set(names)):
            raise ValueError("admission.priorityClasses names must be unique")
        if self.default_priority_class not in names:
            raise ValueError("admission.defaultPriorityClass must name one of admission.priorityClasses")
        if sum(c.reserved_share for c in self.priority_classes) > 1.0:
            raise ValueError("admission.priorityClasses reservedShare must sum to <= 1")
        return self

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "self.priorityClasses.exists(c, c.name == self.defaultPriorityClass)",
                "admission.defaultPriorityClass must name one of admission.priorityClasses",
                ".defaultPriorityClass",
            ),
            cel(
                "self.priorityClasses.map(c, c.reservedShare).sum() <= 1.0",
                "admission.priorityClasses reservedShare must sum to <= 1",
                ".priorityClasses",
            ),
        )
    }
