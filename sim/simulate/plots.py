"""PNG plots of simulation runs (matplotlib, the optional extra ``tidegate[sim]``).

Per scenario, one figure with a column per policy: GPUs held and serving replicas over time (top),
the share of first-class (interactive) arrivals meeting the TTFT SLO per minute (bottom). Raises
:class:`PlotsUnavailable` when matplotlib is not installed.
"""

import math
from collections import defaultdict
from pathlib import Path
from typing import Any


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed: ``pip install 'tidegate[sim]'``."""


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotsUnavailable("plots need matplotlib: pip install 'tidegate[sim]'") from exc
    return plt


def _attainment_per_minute(series: dict[str, list[float]]) -> tuple[list[float], list[float]]:
    met: dict[int, int] = defaultdict(int)
    total: dict[int, int] = defaultdict(int)
    for t, ttft, served, first, slo in zip(
        series["arrival_s"], series["ttft_s"], series["served"], series["first_class"], series["slo_s"], strict=True
    ):
        if not first:
            continue
        minute = int(t // 60)
        total[minute] += 1
        met[minute] += 1 if served and not math.isnan(ttft) and ttft <= slo else 0
    minutes = sorted(total)
    return [m + 0.5 for m in minutes], [met[m] / total[m] for m in minutes]


def write_all(results: list[Any], out: Path) -> list[Path]:
    """One PNG per scenario under ``out``; returns the paths."""
    plt = _pyplot()
    by_scenario: dict[str, list[Any]] = defaultdict(list)
    for r in results:
        by_scenario[r.summary.scenario].append(r)
    paths = []
    for name, runs in by_scenario.items():
        fig, axes = plt.subplots(2, len(runs), figsize=(3.6 * len(runs), 5.5), sharex=True, squeeze=False)
        for col, r in enumerate(runs):
            top, bottom = axes[0][col], axes[1][col]
            t = [p["t"] / 60 for p in r.timeline]
            top.step(t, [p["pods"] for p in r.timeline], where="post", label="GPUs held")
            top.step(t, [p["serving"] for p in r.timeline], where="post", label="serving")
            top.step(t, [p["desired"] for p in r.timeline], where="post", linestyle=":", label="spec.replicas")
            top.set_title(f"{r.summary.policy}: {r.summary.gpu_hours:.1f} GPU-h, {r.summary.flaps} flaps", fontsize=9)
            x, y = _attainment_per_minute(r.series)
            bottom.plot(x, [100 * v for v in y], linewidth=1)
            bottom.axhline(99, color="grey", linestyle="--", linewidth=0.8)
            bottom.set_ylim(0, 102)
            bottom.set_xlabel("minutes")
        axes[0][0].set_ylabel("replicas")
        axes[1][0].set_ylabel("first-class SLO met, % per minute")
        axes[0][0].legend(fontsize=7, loc="upper left")
        fig.suptitle(f"scenario {name}", fontsize=11)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths
