"""``tidegate simulate``: run the policy simulator.

Examples::

    tidegate simulate --scenario spike --policy tidegate --seed 1 --out /tmp/sim
    tidegate simulate --scenario my-scenario.yaml --policy queue
    tidegate simulate --all --jobs 2 --out /tmp/sim-matrix          # every scenario x policy
    tidegate simulate --all --decode-scale 0.5 --scenarios spike    # sensitivity to the replica model
    tidegate simulate --frontier --jobs 2                            # Pareto frontiers, out/frontier/
    tidegate simulate --frontier --grid small --scenarios spike --seeds 0 --cold-start-s 240
    tidegate simulate --frontier --grid bounds --scenarios mixed --cold-start-s 2  # what foresight needs

Prints Markdown tables (summary, then refusals by class and reason); ``--out DIR`` also writes
``table.md``, ``summary.json`` and one PNG per scenario (needs ``tidegate[sim]``).

``--frontier`` runs every policy over a grid of its knobs (tidegate: warm pool and whether it serves, targetUtilization,
targetCapacityRejectRate, the interactive class's reservedShare; the baselines: their threshold and headroom replicas; the ``oracle``, a lower
bound that is not a baseline: its requests/s per replica) on every scenario
and seed, prints per scenario the GPU-hours each policy needs to reach 95%, 99% and 99.9%
interactive SLO attainment and whether a baseline dominates tidegate's default, and writes
``frontier.md``, ``runs.jsonl``, ``<scenario>.md`` and ``<scenario>.png`` (attainment vs GPU-hours,
each policy's Pareto frontier) under ``--out`` (default ``out/frontier``). ``--from-runs FILE``
rebuilds the tables and plots from a ``runs.jsonl`` (one cut short, or several concatenated).

Exit status 2 for a bad scenario, policy or grid.
"""

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidegate.sim.simulate.frontier import Overrides, Point


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
        help="tidegate | queue | http | gie | gpu | tidegate-hpa300 | oracle (a bound: knows the load ahead) (default: %(default)s)",
    )
    p.add_argument("--all", action="store_true", help="run every built-in scenario under every policy")
    p.add_argument("--scenarios", help="with --all/--frontier: comma-separated scenario names or files")
    p.add_argument("--policies", help="with --all/--frontier: comma-separated policy names")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--decode-scale", type=float, default=1.0, metavar="X", help="multiply the decode rate by X")
    p.add_argument(
        "--cold-start-s",
        type=float,
        metavar="S",
        help="rescale node provisioning + model load so their means add up to S seconds",
    )
    p.add_argument("--jobs", type=int, default=1, help="worker processes for --all/--frontier (default: %(default)s)")
    p.add_argument("--frontier", action="store_true", help="Pareto frontiers of every policy's knobs (see above)")
    p.add_argument(
        "--grid",
        default="full",
        help="with --frontier: full | small | bounds (the oracle with and without foresight) (default: %(default)s)",
    )
    p.add_argument("--seeds", default="0,1,2", help="with --frontier: comma-separated seeds (default: %(default)s)")
    p.add_argument(
        "--from-runs",
        type=Path,
        metavar="FILE",
        help="with --frontier: tables and plots from a runs.jsonl already written (e.g. of a sweep cut short)",
    )
    p.add_argument(
        "--out", type=Path, help="write table.md, summary.json and PNG plots here (--frontier: out/frontier)"
    )
    p.add_argument("--no-plots", action="store_true", help="with --out: skip the PNGs")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from tidegate.sim.simulate import matrix, policies, report, scenario

    if args.frontier:
        return _frontier(args)
    if args.all:
        names = args.scenarios.split(",") if args.scenarios else scenario.builtin_names()
        pols = args.policies.split(",") if args.policies else list(policies.POLICIES)
    elif args.scenario:
        names, pols = [args.scenario], [args.policy]
    else:
        print("tidegate simulate: give --scenario NAME|FILE (or --all)", file=sys.stderr)
        return 2
    specs = [matrix.RunSpec(n, p, args.seed, args.decode_scale, args.cold_start_s) for n in names for p in pols]
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


def _frontier(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    import time

    from tidegate.sim.simulate import frontier, scenario

    names = args.scenarios.split(",") if args.scenarios else scenario.builtin_names()
    pols = args.policies.split(",") if args.policies else []
    overrides = frontier.Overrides(args.decode_scale, args.cold_start_s)
    out = args.out if args.out is not None else Path("out/frontier")
    if args.from_runs is not None:
        runs = frontier.load_runs(args.from_runs)
        return _frontier_report(frontier.points(runs), sorted({r.seed for r in runs}), overrides, out, args.no_plots)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        skipped: list[str] = []  # every configuration is checked before hours of runs, not in the middle of them
        todo = frontier.tasks(names, args.grid, seeds, overrides, pols, skipped=skipped)
    except (ValueError, scenario.ScenarioError) as exc:  # FrontierError, UnknownPolicy, a bad --seeds
        print(f"tidegate simulate: {exc}", file=sys.stderr)
        return 2
    for line in skipped:
        print(f"tidegate simulate: skipped {line}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    partial = (out / "runs.jsonl").open("w")  # one line per finished run: a sweep cut short keeps what it ran
    started = time.monotonic()

    def on_run(run: frontier.Run, done: int, total: int) -> None:
        partial.write(json.dumps(dataclasses.asdict(run)) + "\n")
        partial.flush()
        if done == total or done % 25 == 0:
            print(f"  {done}/{total} runs, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)

    print(f"tidegate simulate --frontier: {len(todo)} runs on {args.jobs} worker(s)", file=sys.stderr)
    with partial:
        runs = frontier.run_all(todo, jobs=args.jobs, on_run=on_run)
    return _frontier_report(frontier.points(runs), seeds, overrides, out, args.no_plots)


def _frontier_report(
    points: "dict[str, list[Point]]", seeds: list[int], overrides: "Overrides", out: Path, no_plots: bool
) -> int:
    from tidegate.sim.simulate import frontier

    text = frontier.describe(points, seeds, overrides)
    print(text)
    try:
        paths = frontier.write(points, out, text, plots=not no_plots)
    except RuntimeError as exc:  # plots.PlotsUnavailable
        print(f"tidegate simulate: {exc}", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
