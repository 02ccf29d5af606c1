"""Each local cluster hands its pods loopback addresses of its own (e2e/cluster/cluster.sh ``pod-net``).

Two clusters on one machine used to share 127.10.0.0/16 and 127.200.0.0/16: one cluster's scaler
scraped the other's sidecars and scaled a pool on them (issue 12's break-it review). Now a
cluster's pods are in 127.N.0.0/16, N derived from its name and never one another cluster under
the same cache holds.
"""

import os
import pathlib
import subprocess

CLUSTER_SH = pathlib.Path(__file__).resolve().parents[2] / "e2e" / "cluster" / "cluster.sh"


def _pod_net(name: str, cache: pathlib.Path) -> str:
    env = {**os.environ, "TIDEGATE_CLUSTER_NAME": name, "XDG_CACHE_HOME": str(cache)}
    return subprocess.run(
        [str(CLUSTER_SH), "pod-net"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def _record(cache: pathlib.Path, name: str, net: str) -> None:
    state = cache / "tidegate" / "clusters" / name
    state.mkdir(parents=True)
    (state / "pod-net").write_text(net + "\n")


def test_a_cluster_name_gives_a_loopback_16_that_stays_the_same(tmp_path) -> None:
    net = _pod_net("alpha", tmp_path)
    first, second = (int(x) for x in net.split("."))
    assert first == 127 and 30 <= second <= 199, net  # never a net of a cluster made before (127.200)
    assert _pod_net("alpha", tmp_path) == net


def test_a_net_another_cluster_holds_is_never_chosen_and_a_recorded_one_is_kept(tmp_path) -> None:
    # input: cluster "other" already holds the net "alpha" would derive from its name
    derived = _pod_net("alpha", tmp_path)
    _record(tmp_path, "other", derived)
    # expected: "alpha" gets another net; once recorded, "alpha" keeps its own even if others change
    moved = _pod_net("alpha", tmp_path)
    assert moved != derived and moved.startswith("127."), moved
    _record(tmp_path, "alpha", moved)
    assert _pod_net("alpha", tmp_path) == moved
