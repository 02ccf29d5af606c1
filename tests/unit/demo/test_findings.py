"""The demo's checklist says when interactive requests missed their TTFT SLO during the spike."""

import io

from rich.console import Console

from tidegate.api.constants import ROLE_ACTIVE, ROLE_WARM
from tidegate.demo import findings, scenario, view
from tidegate.demo.timeline import ADMITTED, Outcome, Promotion, Timeline


def _spike(s: scenario.DemoSettings) -> scenario.Phase:
    return next(p for p in scenario.phases(s) if p.name == "spike")


def _interactive(spike: scenario.Phase, ttft_s) -> Timeline:
    """One admitted interactive request every 0.5 s of the spike, TTFT from ``ttft_s(t)``."""
    n = int((spike.end_s - spike.start_s) * 2)
    times = [spike.start_s + i * 0.5 for i in range(n)]
    return Timeline(outcomes=[Outcome(t, "acme", scenario.INTERACTIVE, ADMITTED, ttft_s=ttft_s(t)) for t in times])


def test_a_spike_spent_above_the_interactive_slo_is_a_failed_line_with_the_measured_p99() -> None:
    # Input: the SLO is 1.5 s; TTFT is 3.2 s for the first 70% of the spike, 0.4 s after.
    s = scenario.DemoSettings(duration_s=100)
    spike = _spike(s)
    late = spike.start_s + 0.7 * (spike.end_s - spike.start_s)
    tl = _interactive(spike, lambda t: 3.2 if t < late else 0.4)
    got = findings.interactive_ttft(s, tl, spike)
    assert not got.ok
    assert "interactive p99 TTFT 3.20 s, above its SLO 1.5 s" in got.text
    assert "above the SLO for 25 of 30 s" in got.text  # the 5 s window stays above until it empties of 3.2 s


def test_the_printed_checklist_marks_a_missed_interactive_slo() -> None:
    s = scenario.DemoSettings(duration_s=100)
    out = io.StringIO()
    view.print_summary(s, _interactive(_spike(s), lambda t: 3.2), Console(file=out, width=250))
    assert "✗ spike: interactive p99 TTFT 3.20 s, above its SLO 1.5 s" in out.getvalue()


def test_a_spike_within_the_slo_is_a_passed_line() -> None:
    s = scenario.DemoSettings(duration_s=100)
    spike = _spike(s)
    got = findings.interactive_ttft(s, _interactive(spike, lambda t: 0.6), spike)
    assert got.ok and got.text == "spike: interactive p99 TTFT 0.60 s, within its SLO 1.5 s"
    assert got in findings.findings(s, _interactive(spike, lambda t: 0.6))


def test_no_admitted_interactive_request_is_not_a_pass() -> None:
    s = scenario.DemoSettings(duration_s=100)
    got = findings.interactive_ttft(s, Timeline(), _spike(s))
    assert not got.ok and "no interactive request admitted" in got.text


def test_under_warm_pool_serve_the_checklist_says_whether_the_burst_reached_the_warm_replicas() -> None:
    # Input: warmPool.serve; the spike's first 2 s go round robin to an active and a warm replica,
    # the scale write promotes the warm one 0.2 s later (a relabel, it is already serving).
    s = scenario.DemoSettings(duration_s=100, serve=True)
    spike = _spike(s)
    sent = [spike.start_s + 0.25 * i for i in range(8)]
    roles = [ROLE_ACTIVE, ROLE_WARM] * 4
    tl = Timeline(
        outcomes=[
            Outcome(t, "acme", scenario.INTERACTIVE, ADMITTED, ttft_s=0.3, role=r)
            for t, r in zip(sent, roles, strict=True)
        ],
        promotions=[Promotion(spike.start_s + 2, "demo-2", "warm", 0.2)],
    )
    got = [f for f in findings.findings(s, tl) if "warm replica" in f.text]
    assert got[0].ok and got[0].text.startswith(
        "warm replicas took the burst before any promotion: 4 of the 8 requests sent in the spike's first 2.0 s "
        "went to one (2 of 4 in its first second)"
    )
    assert (
        got[1].ok and "1 warm replica(s) promoted in place 0.2 s after the scale write (already serving)" in got[1].text
    )
    # the same run with every request on the active replica: the warm one took none of the burst
    for o in tl.outcomes:
        o.role = ROLE_ACTIVE
    got = [f for f in findings.findings(s, tl) if "warm replicas took the burst" in f.text]
    assert not got[0].ok and "0 of the 8" in got[0].text
