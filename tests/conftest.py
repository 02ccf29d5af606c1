"""Test tiers by folder: tests/unit -> ``unit``, tests/component -> ``component``,
tests/cluster -> ``cluster`` (needs the local API server), tests/real_engine -> ``real_engine``
(llama.cpp's llama-server with a real model), e2e/ -> ``e2e``."""

import pathlib

import pytest

_TIERS = ("unit", "component", "real_engine", "cluster", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for tier in _TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
