"""Test tiers by folder: tests/unit -> ``unit``, tests/component -> ``component``,
tests/cluster -> ``cluster`` (needs the local API server), tests/real_engine -> ``real_engine``
(llama.cpp's llama-server with a real model), e2e/ -> ``e2e``.

Under pytest-xdist (``make test`` runs the CPU-bound tiers with ``-n 2 --dist loadfile``, then the
cluster and e2e tiers together with ``-n 4 --dist loadfile``, then the ``alone`` tests in one process)
each test file runs on one worker (a module's ``operator`` starts once) and the e2e tier on one
worker (its tests share one launcher: chart, operator, scaler, pod agent); each cluster test has a
namespace of its own. Tests marked ``alone`` need the cluster to themselves (Karpenter's scheduling
messages name other tests' NodePools): ``make test`` runs them after the parallel run, in one
process. This controller gives the workers a folder to agree on the local cluster in
(tests/cluster/conftest.py) and deletes the cluster at the end if a worker started it (unless
TIDEGATE_KEEP_CLUSTER=1).
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


# The cluster tier's longest files, longest first (seconds of one worker on a clean clone at 1cc32e0,
# 3 workers: ~263, ~223, ~178, ~128; each other file under 100 s in a loaded run): a worker that starts one of them last
# keeps the run going minutes after the others are done (longest-processing-time-first).
_LONGEST_FIRST = (
    "tests/cluster/operator/test_scale_to_zero.py",
    "tests/cluster/operator/test_do_not_disrupt.py",
    "tests/cluster/operator/test_karpenter.py",
    "tests/cluster/operator/test_scaler_starts_late.py",
)


def _start_first(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    parts = pathlib.Path(path).parts
    if "e2e" in parts:
        return 0
    if path in _LONGEST_FIRST:
        return 1 + _LONGEST_FIRST.index(path)
    return 1 + len(_LONGEST_FIRST) + (0 if "operator" in parts and "cluster" in parts else 1)


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

            def _reschedule(self, node) -> None:
                # xdist hands a worker its next file while it has 2 tests left, so a file of 1 or 2
                # tests (minutes each here) gets the next file queued behind it from the start while
                # another worker may idle. Hand it over only when the worker is at its last test,
                # which a worker holds until it is told the next one (or to stop).
                if node.shutting_down:
                    return
                if not self.workqueue:
                    node.shutdown()
                    return
                if self._pending_of(self.assigned_work[node]) > 1:
                    return
                self._assign_work_unit(node)

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
