"""``tidegate <command> --help`` reads as terminal text: the docstrings' reST markup never shows."""

import re

import pytest

from tidegate.cli.main import build_parser, plain

MARKUP = re.compile(r"``|:[a-z]+:`|::$", re.MULTILINE)


def _commands() -> dict:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))
    return sub.choices


@pytest.mark.parametrize("command", sorted(_commands()))
def test_help_has_no_rest_markup(command: str) -> None:
    text = _commands()[command].format_help()
    assert not MARKUP.search(text), text


def test_sim_commands_keep_their_examples() -> None:
    backend = _commands()["sim-backend"].format_help()
    assert "tidegate sim-backend --listen 127.0.0.1:8000 --kv-capacity-tokens 20000 --max-running 32" in backend
    assert "(tidegate.sim.replica.ReplicaConfig)" in backend
    simulate = _commands()["simulate"].format_help()
    assert "Examples:\n\n    tidegate simulate --scenario spike" in simulate  # the literal block stays a block


def test_plain_drops_roles_and_literals() -> None:
    text = "See :class:`~tidegate.a.B` and :mod:`tidegate.a`; run ``x --y``.\n\nExamples::\n\n    z a::b\n"
    assert plain(text) == "See B and tidegate.a; run x --y.\n\nExamples:\n\n    z a::b\n"
    assert plain(None) is None
