"""PNG plots of simulation runs (matplotlib, the optional extra ``tidegate[sim]``).

Per scenario, one figure with a column per policy: GPUs held and serving replicas over time (top),
the share of first-class (interactive) arrivals meeting the TTFT SLO per minute (bottom). For
``--frontier``, per scenario: interactive SLO attainment against GPU-hours, every configuration of
every policy, each policy's Pareto frontier, tidegate's default starred (:func:`frontier`). Raises
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


NINES_MAX = 4.0
"""The attainment axis is in nines, ``-log10(1 - attainment)``, clipped at 99.99%."""

_COLORS = {
    "tidegate": "tab:blue",
    "queue": "tab:orange",
    "http": "tab:green",
    "gie": "tab:red",
    "gpu": "tab:purple",
    "oracle": "dimgrey",
}
_BOUNDS = {"oracle"}
"""Policies drawn dashed and labelled as a bound: no one can run them (perfect foresight)."""


def _nines(attainment: float) -> float:
    return NINES_MAX if attainment >= 1 - 10**-NINES_MAX else -math.log10(1.0 - attainment)


def frontier(name: str, points: list[Any], fronts: dict[str, list[Any]], out: Path) -> Path:
    """``out/<name>.png``: attainment (nines axis) vs mean GPU-hours; points of ``frontier.Point`` shape
    (``policy``, ``config``, ``attainment``, ``worst``, ``gpu_hours``), ``fronts`` policy -> its frontier."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for policy, front in fronts.items():
        color = _COLORS.get(policy)
        mine = [p for p in points if p.policy == policy]
        ax.scatter([p.gpu_hours for p in mine], [_nines(p.attainment) for p in mine], s=14, alpha=0.45, color=color)
        bound = policy in _BOUNDS
        ax.plot(
            [p.gpu_hours for p in front], [_nines(p.attainment) for p in front], marker="o", markersize=4,
            linewidth=1.4, color=color, linestyle="--" if bound else "-",
            label=f"{policy}{' (bound: perfect foresight)' if bound else ''} ({len(mine)} configs)",
        )  # fmt: skip
    default = next((p for p in points if p.policy == "tidegate" and p.config == ()), None)
    if default is not None:
        ax.scatter([default.gpu_hours], [_nines(default.attainment)], marker="*", s=220, color="tab:blue",
                   edgecolor="black", zorder=5, label="tidegate default")  # fmt: skip
    for level in (0.95, 0.99, 0.999):
        ax.axhline(_nines(level), color="grey", linestyle="--", linewidth=0.7)
    ticks = [0.0, 0.5, 1.0, 1.30103, 2.0, 3.0, 4.0]
    ax.set_yticks(ticks, ["0%", "68%", "90%", "95%", "99%", "99.9%", ">=99.99%"])
    ax.set_ylim(0, NINES_MAX + 0.2)
    ax.set_xlabel("GPU-hours (mean over seeds)")
    ax.set_ylabel("interactive SLO attainment (mean over seeds)")
    ax.set_title(f"{name}: SLO attainment vs GPU-hours, Pareto frontier per policy", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
