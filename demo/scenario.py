"""What ``tidegate demo`` runs: settings, the replica size, the pool's admission config, the phases
and the multi-tenant workload. Pure: no I/O, no clock; arrivals are drawn from a seeded RNG.

The replica is deliberately small (a "GPU" that runs 8 sequences at ~4 tokens/s each) so that a
laptop can drive several of them to saturation with a few requests per second; what the demo shows
is the shape of the effects (refusals with reasons, scale-up from capacity refusals, warm
promotion, quotas), not a model's absolute speed.

Phases, as fractions of ``duration_s`` (:data:`PHASE_SHARES`):

- ``steady``: three tenants at ``base_utilisation`` of the initial active replicas' capacity;
- ``spike``: the same tenants at ``spike_factor`` x (a 3x burst): capacity refusals, scale-up;
- ``calm``: back to the base load: the pool scales down after the cooldown;
- ``noisy``: base load plus one tenant at ``noisy_factor`` x its quota (per replica quota x
  initial replicas): it gets 429s (policy), the others are unaffected, and no GPU is bought.

Capacity of one replica (:func:`replica_capacity_rps`): ``maxConcurrency`` sequences (here the
tighter limit; the token budget leaves room for batch-heavy moments), each request lasting ``max_tokens x (1 + batch_slowdown x (B - 1)) / decode_tokens_per_s`` seconds (the sim's
decode model, :mod:`tidegate.sim.replica`), averaged over the workload's class mix.
"""

import dataclasses
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidegate.api.scaling import WarmPoolSpec

POOL = "demo"
NAMESPACE = "demo"
MODEL = "sim-llama-3.1-8b"
TENANT_HEADER = "x-tenant-id"
PRIORITY_HEADER = "x-priority"
INTERACTIVE, BATCH = "interactive", "batch"
CLASSES = (INTERACTIVE, BATCH)
NOISY = "umbrella"
SCALER_MAX_SCALE_UP_STEP = "4"
# The API default is 0.02; a demo window of 10 s holds a few dozen requests, where one unlucky refusal is 2-3%.
TARGET_CAPACITY_REJECT_RATE = "0.05"

PHASE_SHARES = (("steady", 0.2), ("spike", 0.3), ("calm", 0.25), ("noisy", 0.25))
PHASE_TEXT = {
    "steady": "three tenants at {base:.0%} of {replicas} replicas",
    "spike": "3x burst from the same tenants",
    "calm": "back to the base load",
    "noisy": f"base load + tenant {NOISY!r} at 10x its quota",
}


@dataclass(frozen=True)
class ReplicaSize:
    """One simulated replica and its sidecar's per-replica limits (tokens, requests, tokens/s)."""

    max_concurrency: int = 8
    token_budget: int = 4096
    decode_tokens_per_s: float = 4.0
    batch_slowdown: float = 0.02
    queue_depth: int = 16
    queue_max_wait_ms: int = 3000
    interactive_slo_ms: int = 1500
    batch_slo_ms: int = 30_000


@dataclass(frozen=True)
class RequestShape:
    """A request of one class: prompt length (characters) and ``max_tokens``."""

    prompt_chars: int
    max_tokens: int


SHAPES = {INTERACTIVE: RequestShape(prompt_chars=240, max_tokens=8), BATCH: RequestShape(900, 16)}


@dataclass(frozen=True)
class TenantLoad:
    """A tenant: fair-queue ``weight``, ``share`` of the base request rate, its interactive fraction."""

    name: str
    weight: float
    share: float
    interactive: float


TENANTS = (
    TenantLoad("acme", weight=3.0, share=0.4, interactive=0.8),
    TenantLoad("globex", weight=2.0, share=0.3, interactive=0.6),
    TenantLoad("initech", weight=1.0, share=0.3, interactive=0.4),
)
NOISY_QUOTA_TOKENS_PER_S = 15.0  # per replica (each sidecar keeps its own bucket)
NOISY_BURST_TOKENS = 150
NOISY_TRICKLE = 0.3  # outside its phase the noisy tenant sends at 0.3x its quota (a known, well-behaved tenant)


@dataclass(frozen=True)
class DemoSettings:
    """Everything ``tidegate demo`` is configured with (units in the names)."""

    duration_s: float = 120.0
    replicas: int = 2  # active at the start (and minReplicas)
    warm: int = 2  # warm pool size
    serve: bool = WarmPoolSpec.model_fields["serve"].default  # spec.warmPool.serve: warm replicas take requests too
    max_replicas: int = 8
    cold_start_s: float = 20.0  # node + model load of a replica that is not warm
    seed: int = 7
    poll_interval_s: float = 2.0  # KEDA pollingInterval (and HPA sync)
    window_s: int = 10  # the scaler's rate window (spec.scaling.signal.windowSeconds, >= 10)
    cooldown_s: int = 15  # spec.scaling.scaleDownCooldownSeconds (the HPA's down stabilisation too)
    base_utilisation: float = 0.55
    spike_factor: float = 3.0
    noisy_factor: float = 10.0
    live: bool = True
    out: Path = Path("tidegate-demo")
    size: ReplicaSize = dataclasses.field(default_factory=ReplicaSize)

    def __post_init__(self) -> None:
        if self.duration_s < 10:
            raise ValueError("duration must be at least 10 s")
        if not 1 <= self.replicas <= self.max_replicas:
            raise ValueError("replicas must be between 1 and max_replicas")
        if self.warm < 0 or self.cold_start_s < 0:
            raise ValueError("warm and cold_start_s must be >= 0")
        if self.window_s < 10:
            raise ValueError("window_s must be >= 10 (spec.scaling.signal.windowSeconds)")


@dataclass(frozen=True)
class Phase:
    name: str
    start_s: float
    end_s: float
    text: str


def phases(s: DemoSettings) -> list[Phase]:
    """The phases over ``[0, duration_s)``, in order."""
    out, t = [], 0.0
    for name, share in PHASE_SHARES:
        end = t + share * s.duration_s
        out.append(Phase(name, t, end, PHASE_TEXT[name].format(base=s.base_utilisation, replicas=s.replicas)))
        t = end
    return out


def phase_at(s: DemoSettings, t: float) -> Phase:
    ps = phases(s)
    return next((p for p in ps if p.start_s <= t < p.end_s), ps[-1])


def estimated_cost_tokens(cls: str, chars_per_token: float = 3.0, safety: float = 1.1) -> int:
    """What the sidecar reserves for one request of ``cls`` (its estimate: chars/3 + 4 per message, x safety, + max_tokens)."""
    shape = SHAPES[cls]
    return math.ceil((shape.prompt_chars / chars_per_token + 4) * safety) + shape.max_tokens


def service_time_s(cls: str, size: ReplicaSize, batch: int) -> float:
    """Seconds one request of ``cls`` runs with ``batch`` sequences decoding (:mod:`tidegate.sim.replica`'s model)."""
    step = (1 + size.batch_slowdown * (batch - 1)) / size.decode_tokens_per_s
    return SHAPES[cls].max_tokens * step


def class_mix() -> dict[str, float]:
    """Share of base requests per class."""
    inter = sum(t.share * t.interactive for t in TENANTS)
    return {INTERACTIVE: inter, BATCH: 1.0 - inter}


def replica_capacity_rps(size: ReplicaSize) -> float:
    """Requests/s one full replica completes under the base class mix: the tighter of its two limits.

    ``maxConcurrency`` sequences at once: ``C / mean duration``. The token budget: by Little's law
    the in-flight tokens ``X x sum_c share_c x duration_c x cost_c`` reach the budget at throughput ``X``.
    """
    mix = class_mix()
    c = size.max_concurrency
    by_concurrency = c / sum(mix[k] * service_time_s(k, size, c) for k in CLASSES)
    token_seconds = sum(mix[k] * service_time_s(k, size, c) * estimated_cost_tokens(k) for k in CLASSES)
    return min(by_concurrency, size.token_budget / token_seconds)


def base_rps(s: DemoSettings) -> float:
    """The base request rate of the three regular tenants (requests/s)."""
    return s.replicas * replica_capacity_rps(s.size) * s.base_utilisation


def rates_at(s: DemoSettings, t: float) -> dict[tuple[str, str], float]:
    """Offered requests/s per ``(tenant, class)`` at time ``t``."""
    phase = phase_at(s, t).name
    factor = s.spike_factor if phase == "spike" else 1.0
    base = base_rps(s) * factor
    out = {}
    for tenant in TENANTS:
        out[(tenant.name, INTERACTIVE)] = base * tenant.share * tenant.interactive
        out[(tenant.name, BATCH)] = base * tenant.share * (1 - tenant.interactive)
    quota_rps = NOISY_QUOTA_TOKENS_PER_S * s.replicas / estimated_cost_tokens(INTERACTIVE)
    out[(NOISY, INTERACTIVE)] = quota_rps * (s.noisy_factor if phase == "noisy" else NOISY_TRICKLE)
    return out


@dataclass(frozen=True, order=True)
class Arrival:
    """One request to send at ``t_s`` (seconds from the start)."""

    t_s: float
    tenant: str
    cls: str


def arrivals(s: DemoSettings) -> list[Arrival]:
    """Poisson arrivals per ``(tenant, class)`` with piecewise-constant rates, sorted by time (seeded)."""
    rng = random.Random(s.seed)
    bounds = [p.end_s for p in phases(s)]
    out: list[Arrival] = []
    for tenant, cls in sorted(rates_at(s, 0.0)):
        t = 0.0
        while t < s.duration_s:
            rate = rates_at(s, t)[(tenant, cls)]
            boundary = next(b for b in bounds if b > t)
            step = rng.expovariate(rate) if rate > 0 else math.inf
            if t + step >= boundary:  # memoryless: restart the draw at the phase boundary
                t = boundary
                continue
            t += step
            out.append(Arrival(t, tenant, cls))
    return sorted(out)


def admission_config(s: DemoSettings) -> dict[str, Any]:
    """The pool's sidecar config document (the file ``tidegate admission --config`` reads)."""
    z = s.size
    return {
        "pool": POOL,
        "namespace": NAMESPACE,
        "model": {"name": MODEL, "engine": "vllm", "maxContextTokens": 8192},
        "admission": {
            "tokenBudget": z.token_budget,
            "maxConcurrency": z.max_concurrency,
            "queue": {"maxDepth": z.queue_depth, "maxWaitMs": z.queue_max_wait_ms},
            "telemetry": {"pollIntervalMs": 250},
            "priorityHeader": PRIORITY_HEADER,
            "defaultPriorityClass": INTERACTIVE,
            "priorityClasses": [
                {"name": INTERACTIVE, "ttftSloMs": z.interactive_slo_ms, "reservedShare": 0.2, "weight": 4},
                {"name": BATCH, "ttftSloMs": z.batch_slo_ms, "reservedShare": 0.0, "weight": 1},
            ],
            "tenancy": {
                "identity": "header",
                "header": TENANT_HEADER,
                "tenants": [{"name": t.name, "weight": t.weight} for t in TENANTS]
                + [
                    {
                        "name": NOISY,
                        "weight": 1.0,
                        "tokensPerSecond": NOISY_QUOTA_TOKENS_PER_S,
                        "burstTokens": NOISY_BURST_TOKENS,
                    }
                ],
            },
        },
    }


def scaler_metadata(s: DemoSettings) -> dict[str, str]:
    """The ScaledObject trigger's metadata, as the operator writes it (:mod:`tidegate.scaler.metadata`)."""
    return {
        "scalerAddress": "in-process",
        "pool": POOL,
        "namespace": NAMESPACE,
        "minReplicas": str(s.replicas),
        "maxReplicas": str(s.max_replicas),
        "targetCapacityRejectRate": TARGET_CAPACITY_REJECT_RATE,
        "targetUtilization": "0.75",
        "maxScaleUpStep": SCALER_MAX_SCALE_UP_STEP,
        "scaleDownCooldownSeconds": str(s.cooldown_s),
        "pollingIntervalSeconds": str(max(1, round(s.poll_interval_s))),
        "windowSeconds": str(s.window_s),
        "source": "sidecar",
    }
