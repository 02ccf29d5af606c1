"""``tidegate simulate``: run the policy simulator.

Examples::

    tidegate simulate --scenario spike --policy tidegate --seed 1 --out /tmp/sim
    tidegate simulate --scenario my-scenario.yaml --policy queue
    tidegate simulate --all --jobs 2 --out /tmp/sim-matrix          # every scenario x policy
    tidegate simulate --all --decode-scale 0.5 --scenarios spike    # sensitivity to the replica model

Prints Markdown tables (summary, then refusals by class and reason); ``--out DIR`` also writes
``table.md``, ``summary.json`` and one PNG per scenario (needs ``tidegate[sim]``). Exit status 2
for a bad scenario or policy.
"""

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="simulate a pool under a scenario and a policy (discrete events, virtual time)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenario", help="built-in scenario name or a YAML file")
    p.add_argument(
        "--policy",
        default="tidegate",
        help="tidegate | queue | http | gie | gpu | tidegate-hpa300 (default: %(default)s)",
    )
    p.add_argument("--all", action="store_true", help="run every built-in scenario under every policy")
    p.add_argument("--scenarios", help="with --all: comma-separated scenario names")
    p.add_argument("--policies", help="with --all: comma-separated policy names")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--decode-scale", type=float, default=1.0, metavar="X", help="multiply the decode rate by X")
    p.add_argument("--jobs", type=int, default=1, help="worker processes for --all (default: %(default)s)")
    p.add_argument("--out", type=Path, help="write table.md, summary.json and PNG plots here")
    p.add_argument("--no-plots", action="store_true", help="with --out: skip the PNGs")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from tidegate.sim.simulate import matrix, policies, report, scenario

    if args.all:
        names = args.scenarios.split(",") if args.scenarios else scenario.builtin_names()
        pols = args.policies.split(",") if args.policies else list(policies.POLICIES)
    elif args.scenario:
        names, pols = [args.scenario], [args.policy]
    else:
        print("tidegate simulate: give --scenario NAME|FILE (or --all)", file=sys.stderr)
        return 2
    specs = [matrix.RunSpec(n, p, args.seed, args.decode_scale) for n in names for p in pols]
    try:
        for name in pols:
            policies.make(name)
        for name in names:
            scenario.load(name)
        results = matrix.run_all(specs, jobs=args.jobs)
    except (scenario.ScenarioError, policies.UnknownPolicy) as exc:
        print(f"tidegate simulate: {exc}", file=sys.stderr)
        return 2
    summaries = [r.summary for r in results]
    print(report.table(summaries))
    print()
    print(report.refusal_table(summaries))
    print()
    print(report.tenant_table(summaries))
    if args.out is not None:
        try:
            paths = matrix.write(results, args.out, plots=not args.no_plots)
        except RuntimeError as exc:  # plots.PlotsUnavailable
            print(f"tidegate simulate: {exc}", file=sys.stderr)
            return 2
        print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0
