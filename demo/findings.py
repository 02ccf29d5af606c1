"""Did the run show what the demo claims? Each finding is checked against the recorded numbers.

Pure. The claims (issue 7): capacity refusals during the spike make the scaler ask for more
replicas; warm replicas serve within seconds of the scale write (under ``warmPool.serve`` they serve
before it: the burst reaches them from its start, and the scale write promotes them in place);
capacity refusals fall once they do; the noisy tenant is refused by policy only and buys no replica; admitted interactive requests
keep their TTFT SLO through the spike (admission refuses rather than queue them past it). A finding
that does not hold is printed as such (the demo reports what happened, it does not assert).
"""

import math
from dataclasses import dataclass

from tidegate.api.constants import ROLE_WARM
from tidegate.demo import scenario
from tidegate.demo.timeline import CAPACITY, POLICY, Timeline


@dataclass(frozen=True)
class Finding:
    ok: bool
    text: str


WINDOW_S = 5
"""The p99 TTFT window of the live view and the plot (seconds)."""

LOAD_REASONS = ("capacity reject", "utilisation")
"""Scale-up reasons that come from load (scaler/law.py decision texts)."""


def _phase(s: scenario.DemoSettings, name: str) -> scenario.Phase:
    return next(p for p in scenario.phases(s) if p.name == name)


def _capacity_rate(timeline: Timeline, start_s: float, end_s: float) -> float:
    """Capacity refusals / requests sent in ``[start_s, end_s)`` (0..1; 0 without requests)."""
    sent = [o for o in timeline.outcomes if start_s <= o.t_s < end_s]
    return sum(o.kind == CAPACITY for o in sent) / len(sent) if sent else 0.0


def interactive_ttft(s: scenario.DemoSettings, timeline: Timeline, phase: scenario.Phase) -> Finding:
    """Interactive p99 TTFT of the requests sent in ``phase`` against the class SLO
    (``interactiveSloMs``), and for how many of its seconds the live view's 5 s p99 sat above it."""
    slo_s = s.size.interactive_slo_ms / 1000
    p99 = timeline.phase_summary(phase.start_s, phase.end_s).p99_ttft_s
    if p99 is None:
        return Finding(False, f"{phase.name}: no interactive request admitted, so no TTFT to hold to its SLO")
    seconds = timeline.ttft_p99(phase.end_s, scenario.INTERACTIVE, window_s=WINDOW_S)
    measured = [v for v in seconds[math.ceil(phase.start_s) : math.ceil(phase.end_s)] if v is not None]
    above = sum(v > slo_s for v in measured)
    return Finding(
        p99 <= slo_s,
        f"{phase.name}: interactive p99 TTFT {p99:.2f} s, {'within' if p99 <= slo_s else 'above'} its SLO {slo_s:g} s"
        + (f"; the {WINDOW_S} s p99 was above the SLO for {above} of {len(measured)} s" if above else ""),
    )


def burst_on_warm(s: scenario.DemoSettings, timeline: Timeline, spike: scenario.Phase) -> Finding:
    """Under ``warmPool.serve``: the spike's requests that went to a warm replica before the first
    promotion (the scale-up had not yet happened; the warm replicas are in the Service)."""
    until = min((p.t_s for p in timeline.promotions if p.t_s >= spike.start_s), default=spike.end_s)
    sent = [o for o in timeline.outcomes if spike.start_s <= o.t_s < until and o.role]
    first = [o for o in sent if o.t_s < spike.start_s + 1]
    on_warm = sum(o.role == ROLE_WARM for o in sent)
    return Finding(
        on_warm > 0,
        f"warm replicas took the burst before any promotion: {on_warm} of the {len(sent)} requests sent in "
        f"the spike's first {until - spike.start_s:.1f} s went to one ({sum(o.role == ROLE_WARM for o in first)} "
        f"of {len(first)} in its first second)",
    )


def findings(s: scenario.DemoSettings, timeline: Timeline) -> list[Finding]:
    """The demo's claims, each with the numbers behind it."""
    spike, noisy = _phase(s, "spike"), _phase(s, "noisy")
    out: list[Finding] = []
    in_spike = timeline.phase_summary(spike.start_s, spike.end_s)
    out.append(
        Finding(in_spike.capacity_total > 0, f"spike: {in_spike.capacity_total} capacity refusals (503 + Retry-After)")
    )
    ups = [e for e in timeline.scale_events if e.after > e.before and e.t_s >= spike.start_s]
    first_up = ups[0] if ups else None
    peak = max((e.after for e in ups), default=s.replicas)
    out.append(
        Finding(
            # Load, not policy, must be the reason: capacity rejections, or token utilisation
            # over target when the scaler gets ahead of them (on a busy machine it often does).
            first_up is not None and any(why in first_up.text for why in LOAD_REASONS),
            f"desired replicas rose {s.replicas} -> {peak}"
            + (f", first at t={first_up.t_s:.0f} s: {first_up.text}" if first_up else ""),
        )
    )
    if s.serve and s.warm:
        out.append(burst_on_warm(s, timeline, spike))
    warm = [p for p in timeline.promotions if p.kind == "warm"]
    cold = [p for p in timeline.promotions if p.kind == "cold"]
    slowest = max((p.seconds for p in warm), default=0)
    out.append(
        Finding(
            bool(warm),
            (
                f"{len(warm)} warm replica(s) promoted in place {slowest:.1f} s after the scale write (already serving)"
                if s.serve
                else f"{len(warm)} warm replica(s) serving {slowest:.1f} s after the scale write"
            )
            + (
                f"; {len(cold)} cold one(s) serving as active after {max(p.seconds for p in cold):.1f} s"
                if cold
                else ""
            ),
        )
    )
    mid = spike.start_s + (spike.end_s - spike.start_s) / 2
    late = spike.end_s - (spike.end_s - spike.start_s) / 4
    early_rate = _capacity_rate(timeline, spike.start_s, mid)
    late_rate = _capacity_rate(timeline, late, spike.end_s)
    out.append(
        Finding(
            late_rate < early_rate,
            f"capacity refusals fell from {early_rate:.0%} (first half of the spike) to {late_rate:.0%} (its last quarter)",
        )
    )
    out.append(interactive_ttft(s, timeline, spike))
    noisy_out = [o for o in timeline.outcomes if noisy.start_s <= o.t_s < noisy.end_s]
    loud = [o for o in noisy_out if o.tenant == scenario.NOISY]
    loud_refused = [o for o in loud if o.kind in (CAPACITY, POLICY)]
    reasons = sorted({o.reason for o in loud_refused})
    others_capacity = sum(1 for o in noisy_out if o.tenant != scenario.NOISY and o.kind == CAPACITY)
    out.append(
        Finding(
            bool(loud_refused) and all(o.kind == POLICY for o in loud_refused),
            f"noisy tenant {scenario.NOISY!r}: {len(loud_refused)} of {len(loud)} refused, reasons {', '.join(reasons) or '-'}"
            f"; other tenants' capacity refusals meanwhile: {others_capacity}",
        )
    )
    noisy_ups = [e for e in timeline.scale_events if e.after > e.before and noisy.start_s <= e.t_s < noisy.end_s]
    out.append(
        Finding(
            not noisy_ups,
            "no scale-up during the noisy phase"
            if not noisy_ups
            else f"{len(noisy_ups)} scale-up(s) during the noisy phase: {noisy_ups[0].text}",
        )
    )
    return out
