"""Sweep one top-level scenario field for one policy and print the summary table.

    .venv/bin/python bench/simulate_sweep.py --scenario spike --policy tidegate --field warm_pool --values 0,1,2,3

Shows what a knob buys (e.g. how many warm replicas it takes to hold the SLO through a spike).
"""

import argparse
import dataclasses
import sys
from concurrent.futures import ProcessPoolExecutor

from tidegate.sim.simulate import core, policies, report, scenario


def _one(args: tuple[str, str, str, float, int]) -> report.Summary:
    name, policy, field, value, seed = args
    sc = scenario.load(name)
    kind = type(getattr(sc, field))
    sc = dataclasses.replace(sc, **{field: kind(value)}, name=f"{sc.name}[{field}={value:g}]")
    return report.summarize(core.Simulator(sc, policies.make(policy), seed=seed).run())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="spike")
    p.add_argument("--policy", default="tidegate")
    p.add_argument("--field", default="warm_pool")
    p.add_argument("--values", default="0,1,2,3")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args()
    runs = [(args.scenario, args.policy, args.field, float(v), args.seed) for v in args.values.split(",")]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        summaries = list(pool.map(_one, runs))
    print(report.table(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
