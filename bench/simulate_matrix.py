"""Run the whole simulator matrix (every built-in scenario x policy) and print its tables and wall time.

    .venv/bin/python bench/simulate_matrix.py [--jobs 2] [--seed 0] [--decode-scale 1.0] [--out DIR]

The tables are deterministic for a seed; only the wall time printed last varies.
"""

import argparse
import sys
import time
from pathlib import Path

from tidegate.sim.simulate import matrix, policies, report, scenario


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--decode-scale", type=float, default=1.0)
    p.add_argument("--scenarios", default=",".join(scenario.builtin_names()))
    p.add_argument("--policies", default=",".join(policies.POLICIES))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    specs = [
        matrix.RunSpec(s, pol, args.seed, args.decode_scale)
        for s in args.scenarios.split(",")
        for pol in args.policies.split(",")
    ]
    start = time.perf_counter()
    results = matrix.run_all(specs, jobs=args.jobs)
    wall = time.perf_counter() - start
    summaries = [r.summary for r in results]
    print(report.table(summaries), report.refusal_table(summaries), report.tenant_table(summaries), sep="\n\n")
    if args.out:
        matrix.write(results, args.out)
    print(f"\n{len(specs)} runs, {args.jobs} jobs: {wall:.0f} s wall", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
