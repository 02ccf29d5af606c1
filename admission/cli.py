"""``tidegate admission``: the admission sidecar (imports aiohttp and the engine lazily)."""

import argparse
import asyncio
from collections.abc import Callable


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "0.0.0.0", int(port)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``admission`` subcommand."""
    p = subparsers.add_parser(
        "admission",
        help="run the admission sidecar in front of a model server",
        description="Token-aware, tenant-fair admission control in front of vLLM, llama.cpp or TGI.",
    )
    p.add_argument("--config", required=True, help="YAML/JSON file with the pool's `model` and `admission` sections")
    p.add_argument("--upstream", required=True, help="the model server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--listen",
        type=_host_port,
        default=("0.0.0.0", 8081),
        metavar="HOST:PORT",
        help="default 0.0.0.0:8081, the port the operator gives the sidecar (8080 is llama.cpp's own)",
    )
    p.add_argument("--labels-file", help="downward-API labels file carrying tidegate.dev/role (absent: active)")
    p.add_argument(
        "--api-keys-dir",
        help="mounted Secret for tenancy.identity apiKey: one file per tenant with SHA-256 digests of its keys",
    )
    p.add_argument("--drain-grace", type=float, metavar="SECONDS", help="default: admission.requestTimeoutSeconds")
    p.add_argument("--log-level", default="INFO")
    p.add_argument(
        "--event-loop", choices=("auto", "uvloop", "asyncio"), default="auto",
        help="auto (default): uvloop where installed (Linux, macOS), else asyncio's own loop",
    )  # fmt: skip
    p.set_defaults(func=_run)


def loop_factory(choice: str) -> "Callable[[], asyncio.AbstractEventLoop] | None":
    """The event loop to serve on: uvloop (libuv; a few per cent less CPU per proxied request and
    about 0.04 ms less added latency than asyncio's selector loop, ``bench/admission_proxy.py``)
    unless asked otherwise or not installed.
    Raises ``SystemExit`` when ``uvloop`` is asked for and missing."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SystemExit("tidegate admission: --event-loop uvloop, but uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


def _run(args: argparse.Namespace) -> int:
    import logging
    import sys

    from tidegate.admission.config import ConfigError, SidecarSettings
    from tidegate.admission.sidecar import serve

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = SidecarSettings.from_env(
        config_path=args.config, upstream=args.upstream, listen_host=args.listen[0], listen_port=args.listen[1],
        labels_file=args.labels_file, api_keys_dir=args.api_keys_dir, drain_grace_s=args.drain_grace,
    )  # fmt: skip
    try:
        with asyncio.Runner(loop_factory=loop_factory(args.event_loop)) as runner:
            return runner.run(serve(settings))
    except ConfigError as exc:
        print(f"tidegate admission: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the listen address is taken or not ours
        print(
            f"tidegate admission: cannot listen on {args.listen[0]}:{args.listen[1]}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
