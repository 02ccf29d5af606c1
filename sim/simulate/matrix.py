"""Run scenarios x policies (optionally in worker processes) and collect summaries and timelines.

Each run is independent and deterministic for its seed, so running them in parallel changes
nothing but the wall time. ``decode_scale`` multiplies the replica model's decode rate and
``cold_start_s`` sets the mean node provisioning + model load (the sensitivity checks: x0.5 and
x2, 240 s).
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
    cold_start_s: float | None = None


@dataclasses.dataclass
class RunResult:
    spec: RunSpec
    summary: report.Summary
    timeline: list[dict[str, float]]
    series: dict[str, list[float]]  # per-request columns for plots


def apply_overrides(
    sc: scenario.Scenario, decode_scale: float = 1.0, cold_start_s: float | None = None
) -> scenario.Scenario:
    """``sc`` with the decode rate x ``decode_scale`` and, when ``cold_start_s`` is given, node
    provisioning and model load rescaled (mean, sd and floor alike) so their means add up to
    ``cold_start_s`` seconds; the name says what changed (``spike@decode0.5x@cold240s``)."""
    if decode_scale != 1.0:
        sc = sc.with_replica(decode_tokens_per_s=sc.replica.decode_tokens_per_s * decode_scale)
        sc = dataclasses.replace(sc, name=f"{sc.name}@decode{decode_scale:g}x")
    if cold_start_s is not None:
        c = sc.cluster
        total = c.node_provisioning_s.mean + c.model_load_s.mean
        if total <= 0:
            raise scenario.ScenarioError(f"{sc.name}: no cold start to rescale (node provisioning + model load = 0 s)")
        k = cold_start_s / total
        node, load = (
            dataclasses.replace(d, mean=d.mean * k, sd=d.sd * k, min=d.min * k)
            for d in (c.node_provisioning_s, c.model_load_s)
        )
        sc = dataclasses.replace(sc, cluster=dataclasses.replace(c, node_provisioning_s=node, model_load_s=load))
        sc = dataclasses.replace(sc, name=f"{sc.name}@cold{cold_start_s:g}s")
    return sc


def run(spec: RunSpec) -> RunResult:
    """One run (raises :class:`~.scenario.ScenarioError` / :class:`~.policies.UnknownPolicy`)."""
    sc = apply_overrides(scenario.load(spec.scenario), spec.decode_scale, spec.cold_start_s)
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
