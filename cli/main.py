"""``tidegate <subcommand>``: the single entry point of the tidegate image.

Subcommands land with the component that implements them; each parses its own flags and
imports its component lazily, so ``tidegate crd`` does not load grpc or kopf.
"""

import argparse
import importlib
import re
import sys
from collections.abc import Sequence

# Modules that each add their subcommands with ``register(subparsers)``; they must import
# nothing heavy at module level (the subcommand's function imports its component lazily).
COMPONENT_CLIS: tuple[str, ...] = (
    "tidegate.admission.cli",
    "tidegate.sim.cli",
    "tidegate.operator.cli",
    "tidegate.scaler.cli",
    "tidegate.demo.cli",
)


def _crd(args: argparse.Namespace) -> int:
    from tidegate.api import crd

    text = crd.render()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")


def plain(text: str | None) -> str | None:
    """A module docstring as terminal help: reST roles, inline literals and ``::`` markers dropped.

    A role keeps its target (``~`` keeps only the last dotted part), a double-backquoted literal
    keeps its text, ``Examples::`` becomes ``Examples:``; line breaks and indentation stay, so a
    literal block under a raw formatter is still a block.
    """
    if text is None:
        return None
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    text = text.replace("``", "")
    return re.sub(r"(?<=\S)::$", ":", text, flags=re.MULTILINE)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="tidegate",
        description="Admission control and reject-rate autoscaling for LLM inference on Kubernetes.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    crd = sub.add_parser("crd", help="print the InferencePool CustomResourceDefinition (YAML)")
    crd.add_argument("-o", "--output", help="write to this file instead of stdout")
    crd.set_defaults(func=_crd)
    for module in COMPONENT_CLIS:
        importlib.import_module(module).register(sub)
    for command in sub.choices.values():  # subcommands take their description from reST docstrings
        command.description = plain(command.description)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the process exit code."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
