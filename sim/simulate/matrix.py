"""Run scenarios x policies (optionally in worker processes) and collect summaries and timelines.

Each run is independent and deterministic for its seed, so running them in parallel changes
nothing but the wall time. ``decode_scale`` multiplies the replica model's decode rate (the
sensitivity check: x0.5 and x2).
"""

import dataclasses
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tidegate.sim.simulate import core, policies, report, scenario


@dataclasses.dataclass(frozen=True)
class RunSpec:
    scenario: str
    policy: str
    seed: int = 0
    decode_scale: float = 1.0


@dataclasses.dataclass
class RunResult:
    spec: RunSpec
    summary: report.Summary
    timeline: list[dict[str, float]]
    series: dict[str, list[float]]  # per-request columns for plots


def run(spec: RunSpec) -> RunResult:
    """One run (raises :class:`~.scenario.ScenarioError` / :class:`~.policies.UnknownPolicy`)."""
    sc = scenario.load(spec.scenario)
    if spec.decode_scale != 1.0:
        sc = sc.with_replica(decode_tokens_per_s=sc.replica.decode_tokens_per_s * spec.decode_scale)
        sc = dataclasses.replace(sc, name=f"{sc.name}@decode{spec.decode_scale:g}x")
    sim = core.Simulator(sc, policies.make(spec.policy), seed=spec.seed).run()
    series = {
        "arrival_s": [r.arrival_s for r in sim.requests],
        "ttft_s": [r.ttft_s if r.ttft_s is not None else float("nan") for r in sim.requests],
        "served": [1.0 if r.outcome is core.Outcome.SERVED else 0.0 for r in sim.requests],
        "first_class": [1.0 if r.priority == sc.classes[0] else 0.0 for r in sim.requests],
        "slo_s": [sc.slo_s(r.priority) for r in sim.requests],
    }
    return RunResult(spec, report.summarize(sim), sim.timeline, series)


def run_all(specs: list[RunSpec], jobs: int = 1) -> list[RunResult]:
    """Every spec, in order; ``jobs`` > 1 runs them in that many processes."""
    if jobs <= 1:
        return [run(s) for s in specs]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run, specs))


def write(results: list[RunResult], out: Path, plots: bool = True) -> list[Path]:
    """Write ``summary.json``, ``table.md`` and (with matplotlib) PNGs under ``out``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    summaries = [r.summary for r in results]
    paths = [out / "table.md", out / "summary.json"]
    tables = (report.table(summaries), report.refusal_table(summaries), report.tenant_table(summaries))
    paths[0].write_text("\n\n".join(tables) + "\n")
    paths[1].write_text("[\n" + ",\n".join(s.to_json() for s in summaries) + "\n]\n")
    if plots:
        from tidegate.sim.simulate import plots as plotting

        paths += plotting.write_all(results, out)
    return paths
