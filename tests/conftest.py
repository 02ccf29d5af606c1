"""Test tiers by folder: tests/unit -> ``unit``, tests/component -> ``component``,
tests/cluster -> ``cluster`` (needs the local API server), tests/real_engine -> ``real_engine``
(llama.cpp's llama-server with a real model), e2e/ -> ``e2e``.

Under pytest-xdist (``make test`` runs the cluster tier with ``-n 3 --dist loadfile``; the CPU-bound
tiers run in one process first, their timing tests fail when they share the 2 cores with 4 workers,
and the e2e tier and ``alone`` tests in one process after) each test file runs on one worker (a module's ``operator`` starts once) and the
e2e tier on one worker (its tests share one launcher: chart, operator, scaler, pod agent); each
cluster test has a namespace of its own. Tests marked ``alone`` need the cluster to themselves
(Karpenter's scheduling messages name other tests' NodePools): ``make test`` runs them after the
parallel run, in one process. This controller gives the workers a folder to agree on the local
cluster in (tests/cluster/conftest.py) and deletes the cluster at the end if a worker started it
(unless TIDEGATE_KEEP_CLUSTER=1).
"""

import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

from tests.cluster.conftest import CLUSTER_SH, CLUSTER_STARTED, RUN_DIR_ENV

_TIERS = ("unit", "component", "real_engine", "cluster", "e2e")
_RUN_DIR = pytest.StashKey[pathlib.Path]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for tier in _TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
    if hasattr(config, "workerinput"):
        # xdist hands out files in this order: the e2e tier and the operator's files (minutes each,
        # waiting on the real controllers) first, so that none of them starts last
        items.sort(key=_start_first)


def _start_first(item: pytest.Item) -> int:
    parts = pathlib.Path(str(item.fspath)).parts
    if "e2e" in parts:
        return 0
    return 1 if "operator" in parts and "cluster" in parts else 2


class _LoadFileWithOneE2e:
    """``--dist loadfile``, except that the e2e tier is one unit: its tests share one launcher per
    session, one per worker otherwise. (Not ``--dist loadgroup``: pytest-xdist 3.8 marks groups by
    rewriting node ids, which pytest 9.2's structured node ids ignore, pytest-xdist issue #1386.)
    Registered only where pytest-xdist is installed (its hook is unknown otherwise)."""

    @staticmethod
    def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
        if config.getoption("dist") != "loadfile":
            return None
        from xdist.scheduler import LoadScopeScheduling

        config.option.loadscopereorder = False  # the order of the collection (pytest_collection_modifyitems)

        class Scheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                path = nodeid.split("::", 1)[0]
                return "tests/e2e" if path.startswith("tests/e2e/") else path

        return Scheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_LoadFileWithOneE2e())
    distributed = getattr(config.option, "dist", "no") != "no"
    if distributed and not hasattr(config, "workerinput"):  # the controller, before it starts the workers
        run_dir = pathlib.Path(tempfile.mkdtemp(prefix="tidegate-xdist-"))
        config.stash[_RUN_DIR] = run_dir
        os.environ[RUN_DIR_ENV] = str(run_dir)  # the workers inherit it


def pytest_unconfigure(config: pytest.Config) -> None:
    run_dir = config.stash.get(_RUN_DIR, None)
    if run_dir is None:
        return
    try:
        if (run_dir / CLUSTER_STARTED).exists() and not os.environ.get("TIDEGATE_KEEP_CLUSTER"):
            subprocess.run([str(CLUSTER_SH), "down"], capture_output=True, check=False)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
