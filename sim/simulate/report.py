"""What a run shows: SLO attainment, latency percentiles, refusals, GPU-hours, scale actions, flaps.

Definitions (per priority class):

- **SLO attainment** = requests *served* with TTFT <= the class's ``ttftSloMs`` / *all* arrivals
  of the class. A refusal, a client timeout or a lost request counts as a miss: refusing is not a
  way to score.
- TTFT and end-to-end percentiles are over served requests (nearest-rank).
- **Refusals** by reason: admission reasons (``tidegate.admission.reasons``), ``gie_saturated``,
  ``no_endpoints``; ``timed_out`` (client gave up before its first token) and ``lost`` (replica
  died) are reported beside them.
- **GPU-hours** over ``[0, duration_s]`` (:meth:`.cluster.Pool.gpu_hours`); **extra GPUs** = the
  most GPUs held at once minus those held at the start.
- **Scale actions** = changes of ``spec.replicas``; a **flap** is an action that reverses the
  direction of the previous one within :data:`FLAP_WINDOW_S`.
"""

import dataclasses
import itertools
import json
import math
from collections import Counter
from typing import Any

from tidegate.sim.simulate.core import Outcome, Simulator

FLAP_WINDOW_S = 600.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclasses.dataclass
class ClassStats:
    arrivals: int
    served: int
    slo_met: int
    ttft_p50_s: float
    ttft_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    outcomes: dict[str, int]
    refusals: dict[str, int]

    @property
    def attainment(self) -> float:
        return self.slo_met / self.arrivals if self.arrivals else math.nan

    @property
    def refused_share(self) -> float:
        return self.outcomes.get(Outcome.REFUSED, 0) / self.arrivals if self.arrivals else 0.0


@dataclasses.dataclass
class Summary:
    scenario: str
    policy: str
    seed: int
    classes: dict[str, ClassStats]
    gpu_hours: float
    start_gpus: int
    peak_gpus: int
    scale_actions: int
    flaps: int
    preemptions: int
    arrivals: int
    tenant_attainment: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def extra_gpus(self) -> int:
        return self.peak_gpus - self.start_gpus

    def to_json(self) -> str:
        doc = dataclasses.asdict(self)
        for name, stats in self.classes.items():
            doc["classes"][name]["attainment"] = stats.attainment
        return json.dumps(doc, indent=2, sort_keys=True, default=str)


def count_flaps(actions: list[Any], window_s: float = FLAP_WINDOW_S) -> int:
    """Direction reversals between consecutive scale actions less than ``window_s`` apart."""
    flaps = 0
    for prev, cur in itertools.pairwise(actions):
        up_prev, up_cur = prev.after > prev.before, cur.after > cur.before
        if up_prev != up_cur and cur.time_s - prev.time_s < window_s:
            flaps += 1
    return flaps


def _peak_gpus(sim: Simulator) -> int:
    edges = []
    end = sim.scenario.duration_s
    for pod in sim.pool.pods:
        if pod.created_s <= end:
            edges.append((pod.created_s, 1))
            if pod.deleted_s is not None:
                edges.append((pod.deleted_s, -1))
    edges.sort()
    level = peak = 0
    for _, delta in edges:
        level += delta
        peak = max(peak, level)
    return peak * sim.scenario.cluster.gpus_per_replica


def summarize(sim: Simulator) -> Summary:
    """The :class:`Summary` of a finished run."""
    sc = sim.scenario
    classes = {}
    for name in sc.classes:
        reqs = [r for r in sim.requests if r.priority == name]
        if not reqs and name not in {s.priority for s in sc.streams}:
            continue
        served = [r for r in reqs if r.outcome is Outcome.SERVED]
        ttft = [r.ttft_s for r in served]
        e2e = [r.done_s - r.arrival_s for r in served]
        slo = sc.slo_s(name)
        classes[name] = ClassStats(
            arrivals=len(reqs),
            served=len(served),
            slo_met=sum(1 for t in ttft if t <= slo),
            ttft_p50_s=percentile(ttft, 50),
            ttft_p99_s=percentile(ttft, 99),
            e2e_p50_s=percentile(e2e, 50),
            e2e_p99_s=percentile(e2e, 99),
            outcomes=dict(sorted(Counter(r.outcome.value for r in reqs).items())),
            refusals=dict(sorted(Counter(r.reason for r in reqs if r.outcome is not Outcome.SERVED).items())),
        )
    tenants: dict[str, list[bool]] = {}
    for r in sim.requests:
        met = r.outcome is Outcome.SERVED and r.ttft_s <= sc.slo_s(r.priority)
        tenants.setdefault(r.tenant, []).append(met)
    start = (sc.cluster.initial_replicas + sim.policy.headroom + sim.policy.warm_pool) * sc.cluster.gpus_per_replica
    return Summary(
        scenario=sc.name,
        policy=sim.policy.name,
        seed=sim.seed,
        classes=classes,
        gpu_hours=round(sim.pool.gpu_hours(sc.duration_s), 6),
        start_gpus=start,
        peak_gpus=_peak_gpus(sim),
        scale_actions=len(sim.actions),
        flaps=count_flaps(sim.actions),
        preemptions=sim.preemptions,
        arrivals=len(sim.requests),
        tenant_attainment={t: round(sum(m) / len(m), 6) for t, m in sorted(tenants.items())},
    )


def _fmt_s(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def table(summaries: list[Summary]) -> str:
    """A Markdown table, one row per (policy, class) of each summary."""
    head = (
        "| scenario | policy | class | SLO met | TTFT p50/p99 s | e2e p50/p99 s | refused | timed out | lost "
        "| GPU-h | +GPUs | actions | flaps |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in summaries:
        for name, c in s.classes.items():
            lines.append(
                f"| {s.scenario} | {s.policy} | {name} | {_pct(c.attainment)} "
                f"| {_fmt_s(c.ttft_p50_s)} / {_fmt_s(c.ttft_p99_s)} | {_fmt_s(c.e2e_p50_s)} / {_fmt_s(c.e2e_p99_s)} "
                f"| {_pct(c.refused_share)} | {c.outcomes.get('timed_out', 0)} | {c.outcomes.get('lost', 0)} "
                f"| {s.gpu_hours:.2f} | {s.extra_gpus} | {s.scale_actions} | {s.flaps} |"
            )
    return "\n".join(lines)


def tenant_table(summaries: list[Summary]) -> str:
    """SLO attainment (all classes) per tenant, one row per run."""
    tenants = sorted({t for s in summaries for t in s.tenant_attainment})
    lines = ["| scenario | policy | " + " | ".join(tenants) + " |", "|---|---|" + "---|" * len(tenants)]
    for s in summaries:
        cells = [_pct(s.tenant_attainment.get(t, math.nan)) for t in tenants]
        lines.append(f"| {s.scenario} | {s.policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def refusal_table(summaries: list[Summary]) -> str:
    """Refusals (and timeouts, losses) by class and reason, one row per (policy, class, reason)."""
    lines = ["| scenario | policy | class | reason | requests |", "|---|---|---|---|---|"]
    for s in summaries:
        for name, c in s.classes.items():
            for reason, n in c.refusals.items():
                lines.append(f"| {s.scenario} | {s.policy} | {name} | {reason} | {n} |")
    return "\n".join(lines)
