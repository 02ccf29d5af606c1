"""The demo's PNG (matplotlib, the optional extra ``tidegate[demo]``): three panels over time.

1. requests per second: offered, admitted, refused for capacity and refused by policy, with
   interactive solid and batch dashed;
2. replicas: desired (spec.replicas), serving (active, and warm under ``warmPool.serve``), active
   (under ``warmPool.serve``), warm, starting (GPUs held = all of them);
3. p99 TTFT of admitted interactive requests (5 s window) against the class SLO.

Phases are shaded in every panel. Raises :class:`PlotsUnavailable` without matplotlib.
"""

from pathlib import Path
from typing import Any

from tidegate.demo import scenario
from tidegate.demo.timeline import ADMITTED, CAPACITY, POLICY, Timeline


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed: ``pip install 'tidegate[demo]'``."""


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotsUnavailable("the plot needs matplotlib: pip install 'tidegate[demo]'") from exc
    return plt


_COLOURS = {"offered": "tab:gray", ADMITTED: "tab:green", CAPACITY: "tab:orange", POLICY: "tab:purple"}
_PHASE_SHADE = {"steady": "#ffffff", "spike": "#fdecea", "calm": "#eef6ee", "noisy": "#f1ecf8"}


def write(settings: scenario.DemoSettings, timeline: Timeline, path: Path) -> Path:
    """Draw the figure to ``path`` (PNG); returns ``path``."""
    plt = _pyplot()
    per = timeline.per_second(settings.duration_s)
    xs = [i + 0.5 for i in range(len(per["offered"]))]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(11, 9), sharex=True, constrained_layout=True)
    for ax in (ax1, ax2, ax3):
        for p in scenario.phases(settings):
            ax.axvspan(p.start_s, p.end_s, color=_PHASE_SHADE[p.name], zorder=0)
    for p in scenario.phases(settings):
        ax1.text((p.start_s + p.end_s) / 2, 1.01, p.name, transform=ax1.get_xaxis_transform(), ha="center", fontsize=9)

    ax1.plot(xs, _smooth(per["offered"]), color=_COLOURS["offered"], lw=2, label="offered (all)")
    for kind, label in (
        (ADMITTED, "admitted"),
        (CAPACITY, "refused: capacity (503)"),
        (POLICY, "refused: policy (429)"),
    ):
        for cls, style in ((scenario.INTERACTIVE, "-"), (scenario.BATCH, "--")):
            ys = per.get(f"{kind}:{cls}")
            if ys is not None and any(ys):
                ax1.plot(xs, _smooth(ys), style, color=_COLOURS[kind], label=f"{label}, {cls}")
    ax1.set_ylabel("requests / s (3 s mean)")
    ax1.legend(loc="upper left", fontsize=8, ncol=2)
    fig.suptitle(f"tidegate demo: {settings.replicas} active + {settings.warm} warm replicas"
                 f"{' (serving)' if settings.serve and settings.warm else ''}, cold start "
                  f"{settings.cold_start_s:g} s, seed {settings.seed}", fontsize=10)  # fmt: skip

    ts = [r.t_s for r in timeline.replicas]
    lines = [("desired", "black", "desired (spec.replicas)"),
             ("serving", "tab:green", "serving (active + warm)" if settings.serve else "serving"),
             ("warm", "tab:blue", "warm"), ("starting", "tab:red", "starting (cold)")]  # fmt: skip
    if settings.serve:
        lines.insert(2, ("active", "tab:olive", "active"))
    for attr, colour, label in lines:
        ax2.step(ts, [getattr(r, attr) for r in timeline.replicas], where="post", color=colour, label=label,
                 lw=2 if attr in ("desired", "serving") else 1.2)  # fmt: skip
    for e in timeline.scale_events:
        ax2.axvline(e.t_s, color="black", lw=0.5, ls=":")
    ax2.set_ylabel("replicas")
    ax2.set_ylim(bottom=0)
    ax2.legend(loc="upper left", fontsize=8)

    p99 = timeline.ttft_p99(settings.duration_s, scenario.INTERACTIVE)
    ax3.plot(
        xs, [float("nan") if v is None else v for v in p99], color="tab:green", label="p99 TTFT, interactive (5 s)"
    )
    ax3.axhline(settings.size.interactive_slo_ms / 1000, color="tab:red", ls="--", lw=1, label="interactive TTFT SLO")
    ax3.set_ylabel("seconds")
    ax3.set_xlabel("seconds since start")
    ax3.set_ylim(bottom=0)
    ax3.legend(loc="upper left", fontsize=8)
    ax3.set_xlim(0, settings.duration_s)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _smooth(ys: list[float], k: int = 3) -> list[float]:
    """Trailing mean over ``k`` seconds (counts per second are noisy at a few requests/s)."""
    out = []
    for i in range(len(ys)):
        window = ys[max(0, i - k + 1) : i + 1]
        out.append(sum(window) / len(window))
    return out
