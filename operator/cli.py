"""``tidegate operator``: run the kopf operator (same as ``kopf run --standalone -A -m tidegate.operator.handlers``)."""

import argparse
from typing import Any


def _run(args: argparse.Namespace) -> int:
    import kopf

    from tidegate.operator import handlers, logs  # handlers: importing it registers them

    logs.configure(verbose=args.verbose, json=args.log_json)
    handlers.STATE.namespaces = tuple(args.namespace or ())
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=tuple(args.namespace or ()),
        liveness_endpoint=args.liveness,
    )
    return 0


def register(sub: Any) -> None:
    """Add ``tidegate operator`` to the CLI."""
    parser = sub.add_parser("operator", help="run the InferencePool operator (kopf)")
    parser.add_argument(
        "-n", "--namespace", action="append", help="watch only this namespace (repeatable); default: all"
    )
    parser.add_argument("--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--log-json", action="store_true", help="structured JSON logs")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also DEBUG, and kopf's routine 'Handler ... succeeded.' lines"
    )
    parser.set_defaults(func=_run)
