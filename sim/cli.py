"""``tidegate sim-backend``: run a simulated vLLM-like model server.

Example: ``tidegate sim-backend --listen 127.0.0.1:8000 --kv-capacity-tokens 20000 --max-running 32
--fault slowdown=2``. Defaults model one H100 serving Llama-3.1-8B
(:class:`tidegate.sim.replica.ReplicaConfig`). Imports aiohttp only when the command runs.
"""

import argparse
import sys

from tidegate.sim import faults, replica


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _positive(kind: type) -> object:
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _fault(text: str) -> dict[str, object]:
    try:
        return faults.parse_flag(text)
    except faults.FaultError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: argparse._SubParsersAction) -> None:
    d = replica.ReplicaConfig()
    p = subparsers.add_parser(
        "sim-backend",
        help="run a simulated OpenAI-compatible model server (vLLM metrics, latency model, fault switches)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--listen", type=_host_port, default=("127.0.0.1", 8000), metavar="HOST:PORT")
    p.add_argument("--model", default="sim-llama-3.1-8b", help="served model name (default: %(default)s)")
    p.add_argument("--kv-capacity-tokens", type=_positive(int), default=d.kv_capacity_tokens, metavar="N")
    p.add_argument(
        "--max-running", type=_positive(int), default=d.max_running, metavar="N", help="max running sequences"
    )
    p.add_argument("--max-batched-tokens", type=_positive(int), default=d.max_batched_tokens, metavar="N")
    p.add_argument("--max-model-len", type=_positive(int), default=None, metavar="N", help="context (tokens)")
    p.add_argument("--prefill-tps", type=_positive(float), default=d.prefill_tokens_per_s, metavar="X")
    p.add_argument(
        "--decode-tps", type=_positive(float), default=d.decode_tokens_per_s, metavar="X", help="per sequence"
    )
    p.add_argument(
        "--batch-slowdown",
        type=float,
        default=d.batch_slowdown,
        metavar="X",
        help="extra decode step time per extra sequence in the batch, as a fraction (default: %(default)s)",
    )
    p.add_argument("--default-max-tokens", type=_positive(int), default=256, metavar="N", help="output without a cap")
    p.add_argument("--time-scale", type=_positive(float), default=1.0, metavar="X", help="run X times faster")
    p.add_argument("--seed", type=int, default=None, help="seed of the fault dice")
    p.add_argument(
        "--fault",
        type=_fault,
        action="append",
        default=[],
        metavar="SPEC",
        help="stall | slowdown=X | error_rate=P | reject_rate=P | freeze_metrics[=GAUGE:V,...] (repeatable)",
    )
    p.set_defaults(func=_run)
    from tidegate.sim.simulate import cli as simulate_cli

    simulate_cli.register(subparsers)


def _run(args: argparse.Namespace) -> int:
    from aiohttp import web

    from tidegate.sim.server import SimBackend, SimSettings

    try:
        cfg = replica.ReplicaConfig(
            prefill_tokens_per_s=args.prefill_tps,
            decode_tokens_per_s=args.decode_tps,
            batch_slowdown=args.batch_slowdown,
            kv_capacity_tokens=args.kv_capacity_tokens,
            max_running=args.max_running,
            max_batched_tokens=args.max_batched_tokens,
            max_model_len=args.max_model_len,
        )
        state = faults.Faults()
        for patch in args.fault:
            state = faults.apply(state, patch)
    except ValueError as exc:
        print(f"tidegate sim-backend: {exc}", file=sys.stderr)
        return 2
    settings = SimSettings(
        model_name=args.model,
        replica=cfg,
        time_scale=args.time_scale,
        default_max_tokens=args.default_max_tokens,
        faults=state,
        seed=args.seed,
    )
    host, port = args.listen
    web.run_app(
        SimBackend(settings).app(),
        host=host,
        port=port,
        handler_cancellation=True,
        access_log=None,
        print=lambda _: print(f"sim-backend serving {args.model} on http://{host}:{port}", flush=True),
    )
    return 0
