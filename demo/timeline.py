"""What the demo saw, and what it means: per-request outcomes, replica counts, scale events and
promotions, turned into per-second series (for the live view and the plot) and per-phase summaries.

Pure: every record carries its own time (seconds since the demo started); nothing here reads a
clock or a socket. Outcomes are bucketed by the second the request was *sent* in, so "offered"
and "refused" of one second describe the same requests.

Outcome kinds: ``admitted`` (HTTP 200), ``capacity`` (503 with a capacity reason: budget, queue,
SLO, KV, breaker), ``policy`` (429/4xx with a policy reason: tenant rate, too large, ...),
``error`` (anything else: transport errors, 5xx from the backend).
"""

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from tidegate.admission.reasons import CAPACITY_REASONS, Reason

ADMITTED, CAPACITY, POLICY, ERROR = "admitted", "capacity", "policy", "error"
KINDS = (ADMITTED, CAPACITY, POLICY, ERROR)


def kind_of(status: int, code: str | None) -> str:
    """The outcome kind of an HTTP answer (``code``: the OpenAI error body's ``code``, the admission reason)."""
    if status == 200:
        return ADMITTED
    try:
        reason = Reason(code) if code else None
    except ValueError:
        reason = None
    if reason is None or reason is Reason.NOT_ACTIVE:
        return ERROR
    return CAPACITY if reason in CAPACITY_REASONS else POLICY


@dataclass
class Outcome:
    """One request: sent at ``t_s``; ``ttft_s`` from sending to the first streamed token (admitted only,
    filled in when it arrives: an outcome is recorded as soon as the answer's status is known)."""

    t_s: float
    tenant: str
    cls: str
    kind: str
    reason: str = ""
    ttft_s: float | None = None
    role: str = ""  # the role of the pod its last attempt went to, when sent ("" without one)


@dataclass(frozen=True)
class ReplicaSample:
    """The pool at ``t_s``: ``desired`` (spec.replicas), ``serving`` (in the Service: active pods, and
    warm ones under ``warmPool.serve``), ``warm`` (loaded, ready to promote), ``starting`` (cold: node +
    model load), ``pods`` (all, each a GPU), ``active`` (active and in the Service)."""

    t_s: float
    desired: int
    serving: int
    warm: int
    starting: int
    pods: int
    active: int = 0


@dataclass(frozen=True)
class ScaleEvent:
    """A write of spec.replicas by the HPA stand-in, with the scaler's decision text at the time and,
    when the HPA wrote other than the scaler's metric asked, why (``hpa``: its step policy, its
    stabilisation window, min/maxReplicas)."""

    t_s: float
    before: int
    after: int
    text: str
    hpa: str = ""


@dataclass(frozen=True)
class Promotion:
    """A pod that started serving: ``kind`` ``warm`` (relabelled) or ``cold`` (started, then promoted);
    ``seconds`` from the scale write that asked for it to its first ready answer in the Service."""

    t_s: float
    pod: str
    kind: str
    seconds: float


@dataclass
class Timeline:
    """Everything recorded during one run."""

    outcomes: list[Outcome] = field(default_factory=list)
    replicas: list[ReplicaSample] = field(default_factory=list)
    scale_events: list[ScaleEvent] = field(default_factory=list)
    promotions: list[Promotion] = field(default_factory=list)
    last_decision: str = ""

    # ---- series ----------------------------------------------------------------------------

    def per_second(self, duration_s: float) -> dict[str, list[float]]:
        """Counts per whole second ``[i, i+1)``: ``offered``, ``<kind>``, ``<kind>:<class>``."""
        n = max(1, math.ceil(duration_s))
        series: dict[str, list[float]] = defaultdict(lambda: [0.0] * n)
        for o in self.outcomes:
            i = min(n - 1, max(0, int(o.t_s)))
            series["offered"][i] += 1
            series[f"offered:{o.cls}"][i] += 1
            series[o.kind][i] += 1
            series[f"{o.kind}:{o.cls}"][i] += 1
        series["offered"]
        return dict(series)

    def ttft_p99(self, duration_s: float, cls: str, window_s: float = 5.0) -> list[float | None]:
        """p99 TTFT (seconds) of admitted ``cls`` requests sent in the ``window_s`` before each second's end."""
        n = max(1, math.ceil(duration_s))
        by_second: dict[int, list[float]] = defaultdict(list)
        for o in self.outcomes:
            if o.cls == cls and o.ttft_s is not None:
                by_second[int(o.t_s)].append(o.ttft_s)
        out: list[float | None] = []
        w = max(1, round(window_s))
        for i in range(n):
            values = [v for j in range(i - w + 1, i + 1) for v in by_second.get(j, ())]
            out.append(percentile(values, 0.99) if values else None)
        return out

    def replicas_at(self, t_s: float) -> ReplicaSample | None:
        """The last replica sample at or before ``t_s``."""
        last = None
        for r in self.replicas:
            if r.t_s > t_s:
                break
            last = r
        return last

    def gpu_seconds(self) -> tuple[float, float]:
        """(GPU-seconds held by all pods, GPU-seconds of serving pods), integrated over the samples."""
        held = serving = 0.0
        for a, b in zip(self.replicas, self.replicas[1:], strict=False):
            dt = b.t_s - a.t_s
            held += a.pods * dt
            serving += a.serving * dt
        return held, serving

    # ---- summaries ---------------------------------------------------------------------------

    def phase_summary(self, start_s: float, end_s: float) -> "PhaseSummary":
        """Counts and latencies of requests sent in ``[start_s, end_s)`` and the replicas over it."""
        sent = [o for o in self.outcomes if start_s <= o.t_s < end_s]
        by = Counter((o.kind, o.cls) for o in sent)
        reasons = Counter(o.reason for o in sent if o.kind in (CAPACITY, POLICY))
        policy_tenants = Counter(o.tenant for o in sent if o.kind == POLICY)
        ttfts = [o.ttft_s for o in sent if o.cls == "interactive" and o.ttft_s is not None]
        samples = [r for r in self.replicas if start_s <= r.t_s < end_s]
        return PhaseSummary(
            offered=len(sent),
            admitted=sum(n for (k, _), n in by.items() if k == ADMITTED),
            capacity={c: n for (k, c), n in by.items() if k == CAPACITY},
            policy={c: n for (k, c), n in by.items() if k == POLICY},
            errors=sum(n for (k, _), n in by.items() if k == ERROR),
            reasons=dict(reasons),
            policy_tenants=dict(policy_tenants),
            p99_ttft_s=percentile(ttfts, 0.99) if ttfts else None,
            serving_min=min((r.serving for r in samples), default=0),
            serving_max=max((r.serving for r in samples), default=0),
            desired_max=max((r.desired for r in samples), default=0),
        )


@dataclass(frozen=True)
class PhaseSummary:
    offered: int
    admitted: int
    capacity: dict[str, int]
    policy: dict[str, int]
    errors: int
    reasons: dict[str, int]
    policy_tenants: dict[str, int]
    p99_ttft_s: float | None
    serving_min: int
    serving_max: int
    desired_max: int

    @property
    def capacity_total(self) -> int:
        return sum(self.capacity.values())

    @property
    def policy_total(self) -> int:
        return sum(self.policy.values())


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest-rank method; raises ValueError on an empty list."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
