"""The live view and the plain progress line show what the pool is doing."""

import io

from rich.console import Console

from tidegate.demo import scenario, view
from tidegate.demo.timeline import ADMITTED, CAPACITY, Outcome, ReplicaSample, Timeline


class _Pool:
    def sample(self) -> ReplicaSample:
        return ReplicaSample(t_s=12.0, desired=5, serving=4, warm=0, starting=1, pods=7)


def _view(live: bool) -> tuple[view.LiveView, io.StringIO]:
    s = scenario.DemoSettings(duration_s=60, live=live)
    tl = Timeline(last_decision="2 -> 5: capacity reject 31% across 3 tenants (2 warm promoted first)")
    tl.outcomes += [Outcome(8.0 + i * 0.1, "acme", "interactive", ADMITTED, ttft_s=0.4) for i in range(20)]
    tl.outcomes += [Outcome(9.0 + i * 0.1, "acme", "batch", CAPACITY, "queue_full") for i in range(10)]
    out = io.StringIO()
    return view.LiveView(s, tl, _Pool(), None, lambda: 12.5, Console(file=out, width=120)), out


def test_live_panel_shows_rates_replicas_and_the_scalers_reason() -> None:
    v, _ = _view(live=True)
    out = io.StringIO()
    Console(file=out, width=120).print(v.render())
    text = out.getvalue()
    assert "phase spike" in text
    assert "serving 4" in text and "starting (cold) 1" in text and "desired (spec.replicas) 5" in text
    assert "capacity reject 31%" in text
    assert "refused: capacity (503)" in text and "2.0" in text  # 10 batch refusals over the last 5 s


def test_plain_line_for_ci_logs() -> None:
    v, out = _view(live=False)
    v.refresh()
    line = out.getvalue()
    assert "spike" in line and "refused capacity  2.0/s" in line and "desired 5" in line and "p99 TTFT 0.40s" in line
