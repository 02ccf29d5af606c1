"""The demo's terminal output: the live view (rich), plain progress lines for CI logs, the summary.

Live (default): one panel redrawn twice a second with the last 5 s of offered / admitted /
refused (capacity vs policy) per second, replicas serving (of them active, under ``warmPool.serve``) /
warm / starting and desired, p99 TTFT
of interactive requests, the scaler's last decision text and the latest events. ``--no-live``:
one plain line every 5 s instead (no cursor movement). The summary (:func:`print_summary`) is
plain rich tables either way.
"""

import math
from collections.abc import Callable
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tidegate.demo import findings, plot, scenario
from tidegate.demo.timeline import ADMITTED, CAPACITY, ERROR, POLICY, Timeline

WINDOW_S = 5


class LiveView:
    """A context manager; call :meth:`refresh` periodically inside it."""

    def __init__(self, settings: scenario.DemoSettings, timeline: Timeline, pool, load, clock: Callable[[], float],
                 console: Console) -> None:  # fmt: skip
        self.s, self.timeline, self.pool, self.load, self.clock, self.console = (
            settings, timeline, pool, load, clock, console,
        )  # fmt: skip
        self._live: Live | None = None
        self._next_line_s = 0.0

    def __enter__(self) -> "LiveView":
        if self.s.live:
            self._live = Live(self.render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        else:
            self.console.print(f"tidegate demo: {self.s.duration_s:.0f} s, phases: " + ", ".join(
                f"{p.name} {p.start_s:.0f}-{p.end_s:.0f} s" for p in scenario.phases(self.s)))  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(self.render())
            self._live.__exit__(None, None, None)
            self._live = None

    def _rates(self) -> dict[str, float]:
        now = self.clock()
        end = max(0, int(now))
        start = max(0, end - WINDOW_S)
        per = self.timeline.per_second(max(1.0, now))
        span = max(1, end - start)
        return {k: sum(v[start:end]) / span for k, v in per.items()}

    def _p99(self) -> float | None:
        now = self.clock()
        values = self.timeline.ttft_p99(max(1.0, now), scenario.INTERACTIVE, window_s=WINDOW_S)
        return next((v for v in reversed(values[:-1] or values) if v is not None), None)

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self.render())
            return
        now = self.clock()
        if now >= self._next_line_s:
            self._next_line_s = now + 5.0
            self.console.print(self.line(), highlight=False)

    def line(self) -> str:
        """The plain progress line (``--no-live``)."""
        r, rep, p99 = self._rates(), self.pool.sample(), self._p99()
        phase = scenario.phase_at(self.s, self.clock()).name
        return (
            f"t={self.clock():5.1f}s {phase:<6} offered {r.get('offered', 0):5.1f}/s admitted {r.get(ADMITTED, 0):5.1f}/s "
            f"refused capacity {r.get(CAPACITY, 0):4.1f}/s policy {r.get(POLICY, 0):4.1f}/s | replicas serving "
            f"{rep.serving}{f' ({rep.active} active)' if self.s.serve else ''} warm {rep.warm} starting {rep.starting} "
            f"desired {rep.desired} | p99 TTFT "
            f"{_secs(p99)} | {self.timeline.last_decision}"
        )

    def render(self) -> Panel:
        now = self.clock()
        phase = scenario.phase_at(self.s, now)
        r, rep, p99 = self._rates(), self.pool.sample(), self._p99()
        traffic = Table(title=f"requests per second (last {WINDOW_S} s)", expand=True)
        for col in ("", "interactive", "batch", "all"):
            traffic.add_column(col, justify="right" if col else "left")
        for label, kind, style in (("offered", "offered", ""), ("admitted", ADMITTED, "green"),
                                   ("refused: capacity (503)", CAPACITY, "yellow"),
                                   ("refused: policy (429)", POLICY, "magenta"), ("errors", ERROR, "red")):  # fmt: skip
            cells = [f"{r.get(f'{kind}:{c}', 0):.1f}" for c in scenario.CLASSES]
            traffic.add_row(Text(label, style=style), *cells, f"{r.get(kind, 0):.1f}")
        slo = self.s.size.interactive_slo_ms / 1000
        replicas = Text.from_markup(
            f"replicas: serving [bold green]{rep.serving}[/]{f' ({rep.active} active)' if self.s.serve else ''}"
            f" · warm [blue]{rep.warm}[/]{' (serving too)' if self.s.serve else ''} · starting (cold) "
            f"[red]{rep.starting}[/] · desired (spec.replicas) [bold]{rep.desired}[/] · GPUs held {rep.pods}\n"
            f"p99 TTFT, interactive ({WINDOW_S} s): [bold]{_secs(p99)}[/] (SLO {slo:g} s)"
        )
        events = [
            f"t={e.t_s:5.1f}s scale {e.before} -> {e.after}" + (f" ({e.hpa})" if e.hpa else "")
            for e in self.timeline.scale_events[-3:]
        ] + [
            f"t={p.t_s:5.1f}s {p.pod} active ({p.kind}, {p.seconds:.1f} s after the scale write)"
            for p in self.timeline.promotions[-3:]
        ]
        body = Group(
            Text(f"phase {phase.name}: {phase.text}", style="bold"),
            traffic,
            replicas,
            Text(f"scaler: {self.timeline.last_decision or '(first window)'}", style="cyan"),
            Text("\n".join(sorted(events)[-4:]), style="dim"),
        )
        clock = f"t={now:5.1f} s / {self.s.duration_s:.0f} s" if now <= self.s.duration_s else "finishing"
        return Panel(body, title=f"tidegate demo  {clock}", border_style="blue")


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


def write_plot(settings: scenario.DemoSettings, timeline: Timeline, path: Path, console: Console) -> Path | None:
    """The PNG, or None (and a note) without matplotlib."""
    try:
        return plot.write(settings, timeline, path)
    except plot.PlotsUnavailable as exc:
        console.print(f"[yellow]no plot: {exc}[/]")
        return None


def print_summary(settings: scenario.DemoSettings, timeline: Timeline, console: Console) -> None:
    """The closing tables: phases, scale decisions, promotions, GPU-seconds, and the findings."""
    t = Table(title="What happened, phase by phase", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for col in ("phase", "offered", "admitted", "capacity\nrefused (i/b)", "policy\nrefused", "p99 TTFT\ninteract.",
                "serving", "desired\nmax"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("phase", "policy\nrefused") else "right")
    for p in scenario.phases(settings):
        ps = timeline.phase_summary(p.start_s, p.end_s)
        cap = f"{ps.capacity_total} ({ps.capacity.get('interactive', 0)}/{ps.capacity.get('batch', 0)})"
        pol = ", ".join(f"{v} {k}" for k, v in sorted(ps.policy_tenants.items())) or "0"
        t.add_row(f"{p.name} {p.start_s:.0f}-{p.end_s:.0f}s", str(ps.offered), str(ps.admitted), cap, pol,
                  _secs(ps.p99_ttft_s), f"{ps.serving_min}-{ps.serving_max}", str(ps.desired_max))  # fmt: skip
    console.print(t)
    d = Table(
        title="Scale decisions (spec.replicas written by the HPA stand-in; the scaler's reason; why the HPA "
        "wrote a different count, where it did)",
        box=box.SIMPLE_HEAD,
    )
    for col in ("t", "replicas", "scaler's decision", "HPA"):
        d.add_column(col)
    for e in timeline.scale_events:
        d.add_row(f"{e.t_s:.1f} s", f"{e.before} -> {e.after}", e.text, e.hpa)
    console.print(d)
    pr = Table(title="Promotions (scale write -> serving as active)", box=box.SIMPLE_HEAD)
    for col in ("t", "pod", "kind", "seconds"):
        pr.add_column(col)
    for p in timeline.promotions:
        pr.add_row(f"{p.t_s:.1f} s", p.pod, p.kind, f"{p.seconds:.1f}")
    console.print(pr)
    held, serving = timeline.gpu_seconds()
    peak = max((r.pods for r in timeline.replicas), default=0)
    console.print(
        f"GPU-seconds: {held:.0f} held (serving {serving:.0f}, the rest "
        f"{'loading or draining' if settings.serve else 'warm or loading'}): on average "
        f"{held / settings.duration_s:.1f} GPUs, peak {peak}; keeping the peak for the whole run: "
        f"{peak * settings.duration_s:.0f}",
        highlight=False,
    )
    for f in findings.findings(settings, timeline):
        mark = "[green]✓[/]" if f.ok else "[red]✗[/]"
        console.print(f"{mark} {f.text}", highlight=False)


def wall_text(seconds: float) -> str:
    return f"{math.floor(seconds / 60)}m{seconds % 60:04.1f}s"
