"""The seeds' benchmark in the simulator: a 34B-class model on A100-class replicas, 60% short / 40% long.

    .venv/bin/python bench/simulate_seeds_34b.py --seeds 0,1,2 --jobs 2

Runs the built-in scenario ``mixed-34b-a100`` (its description gives the replica figures and their
sources) as:

- ``http@N`` / ``queue@N``: autoscaling alone (no admission), ``minReplicas`` N (the pool starts
  there), ``maxReplicas`` 16, for N in 2, 4 and 8;
- ``tidegate@2``: admission with batch composition (``maxPrefillTokens``) on 2 fixed replicas, the
  scenario as written; ``tidegate@2 no-breaker`` the same with the circuit breaker off;
  ``tidegate@2 no-composition`` without ``maxPrefillTokens``.

Prints the summary table (mean over seeds per variant: SLO attainment per class, GPU-hours) and
goodput (requests served within their class's SLO per GPU-hour).
"""

import argparse
import dataclasses
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

from tidegate.sim.simulate import core, frontier, policies, report, scenario

SCENARIO = "mixed-34b-a100"


def variants() -> dict[str, tuple[str, scenario.Scenario]]:
    """Label -> (policy, scenario)."""
    sc = scenario.load(SCENARIO)
    adm = sc.admission
    out = {}
    for n in (2, 4, 8):
        for policy in ("http", "queue"):
            out[f"{policy}@{n}"] = (policy, frontier.configure(sc, (("maxReplicas", 16), ("minReplicas", n))))
    out["tidegate@2"] = ("tidegate", sc)
    no_breaker = adm.circuit_breaker.model_copy(update={"enabled": False})
    out["tidegate@2 no-breaker"] = (
        "tidegate",
        dataclasses.replace(sc, admission=adm.model_copy(update={"circuit_breaker": no_breaker})),
    )
    out["tidegate@2 no-composition"] = (
        "tidegate",
        dataclasses.replace(sc, admission=adm.model_copy(update={"max_prefill_tokens": None})),
    )
    return out


def _one(job: tuple[str, int]) -> tuple[str, int, report.Summary]:
    label, seed = job
    policy, sc = variants()[label]
    return label, seed, report.summarize(core.Simulator(sc, policies.make(policy), seed=seed).run())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = [(label, seed) for label in variants() for seed in seeds]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(_one, jobs))
    classes = scenario.load(SCENARIO).classes
    head = " | ".join(f"{c} SLO met (worst seed)" for c in classes)
    print(f"| variant | {head} | refused | GPU-h | served in SLO per GPU-h |")
    print("|---|" + "---|" * (len(classes) + 3))
    for label in variants():
        runs = [s for lab, _, s in results if lab == label]
        cells = []
        for c in classes:
            att = [s.classes[c].attainment for s in runs]
            cells.append(f"{100 * statistics.fmean(att):.1f}% ({100 * min(att):.1f}%)")
        refused = statistics.fmean(
            sum(s.classes[c].outcomes.get("refused", 0) for c in classes) / s.arrivals for s in runs
        )
        gpu_h = statistics.fmean(s.gpu_hours for s in runs)
        good = statistics.fmean(sum(s.classes[c].slo_met for c in classes) / s.gpu_hours for s in runs)
        print(f"| {label} | {' | '.join(cells)} | {100 * refused:.1f}% | {gpu_h:.2f} | {good:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
