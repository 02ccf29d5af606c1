"""``tidegate demo``: admission and reject-rate autoscaling on this machine, no cluster needed.

Imports the demo (aiohttp, grpc, rich, matplotlib) only when the command runs.
"""

import argparse
from pathlib import Path


def _positive(kind: type):
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _serve_default() -> bool:
    from tidegate.api.scaling import WarmPoolSpec

    return WarmPoolSpec.model_fields["serve"].default


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` subcommand."""
    p = subparsers.add_parser(
        "demo",
        help="run the whole loop locally: sim model servers behind real sidecars, the real scaler, a bursty load",
        description="Starts simulated model servers behind real admission sidecars, the real scaler (gRPC) and a "
        "local stand-in for KEDA/HPA and the operator (warm replicas promoted at once, cold ones after a delay), "
        "drives a multi-tenant load (steady, a 3x spike, calm, a noisy tenant at 10x its quota), shows it live, "
        "and writes a PNG and a summary. Everything listens on 127.0.0.1 and stops at the end.",
    )
    p.add_argument("--duration", type=_positive(float), default=120.0, metavar="SECONDS", help="default %(default)s")
    p.add_argument("--replicas", type=_positive(int), default=2, help="active replicas at the start, also minReplicas (default %(default)s)")  # fmt: skip
    p.add_argument("--warm", type=int, default=2, help="warm pool size (default %(default)s)")
    p.add_argument("--warm-serve", action=argparse.BooleanOptionalAction, default=None,
                   help="warm replicas take requests too (spec.warmPool.serve; default: the API's, "
                   f"{str(_serve_default()).lower()})")  # fmt: skip
    p.add_argument("--max-replicas", type=_positive(int), default=8, help="maxReplicas (default %(default)s)")
    p.add_argument("--cold-start-s", type=float, default=20.0, metavar="SECONDS",
                   help="node + model load of a replica that is not warm (default %(default)s)")  # fmt: skip
    p.add_argument("--poll-interval-s", type=_positive(float), default=2.0, metavar="SECONDS",
                   help="KEDA pollingInterval, compressed for the demo (default %(default)s)")  # fmt: skip
    p.add_argument("--cooldown-s", type=int, default=15, metavar="SECONDS", help="scale-down cooldown (default %(default)s)")  # fmt: skip
    p.add_argument("--seed", type=int, default=7, help="seed of the arrivals (default %(default)s)")
    p.add_argument("--out", type=Path, default=Path("tidegate-demo"), help="folder for the PNG, timeline.json and admission.yaml (default ./%(default)s/)")  # fmt: skip
    p.add_argument("--no-live", action="store_true", help="plain progress lines instead of the live view (CI logs)")
    p.add_argument("--log-level", default="WARNING")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import sys

    from rich.console import Console

    from tidegate.demo import run, scenario, view

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = scenario.DemoSettings(
            duration_s=args.duration, replicas=args.replicas, warm=args.warm,
            serve=_serve_default() if args.warm_serve is None else args.warm_serve, max_replicas=args.max_replicas,
            cold_start_s=args.cold_start_s, poll_interval_s=args.poll_interval_s, cooldown_s=args.cooldown_s,
            seed=args.seed, live=not args.no_live, out=args.out,
        )  # fmt: skip
    except ValueError as exc:
        print(f"tidegate demo: {exc}", file=sys.stderr)
        return 2
    console = Console()
    if not console.is_terminal:  # CI logs: wide enough for the summary tables
        console = Console(width=120)
    result = asyncio.run(run.run(settings, console))
    view.print_summary(settings, result.timeline, console)
    files = [str(f) for f in (result.png, result.timeline_json, result.config_file) if f is not None]
    console.print(f"wrote {', '.join(files)}; wall time {view.wall_text(result.wall_s)}", highlight=False)
    return 0
