"""The operator's log over one pool's life, at the default level (issue 14 item 5).

What an on-call engineer reads: every line has a UTC time and a level; the routine (kopf's
``Handler 'pod_event' succeeded.`` per pod event and timer run) is not there; every warning or
error names the pool; a failure carries the API server's own message, not only its status code.
"""

import re
import subprocess
import sys
import time

import kubernetes
import pytest

from tests.cluster.conftest import wait_for
from tests.cluster.operator.conftest import operator_env, stop_operator
from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+ ")
DEADLINE_S = 60


@pytest.fixture
def operator_log(cluster_env, api_client, scaler_health, namespace, tmp_path):
    """A `tidegate operator -n <namespace>` at the default level; yields the path of its output."""
    env = operator_env(cluster_env, api_client, scaler_health, tmp_path)
    path = tmp_path / "operator.log"
    with path.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidegate.cli.main", "operator", "-n", namespace],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield path
    finally:
        stop_operator(proc)


def _condition(custom, namespace: str, name: str, ctype: str) -> dict:
    pool = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return next((c for c in pool.get("status", {}).get("conditions", []) if c["type"] == ctype), {})


def test_a_pools_life_logs_times_levels_and_the_pool_on_every_warning_and_no_routine(
    api_client, namespace: str, operator_log
) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    body = valid_pool("lc")
    # Born broken: a volume mount of a volume the pod does not declare (the Deployment is refused).
    body["spec"]["server"]["volumeMounts"] = [{"name": "weights", "mountPath": "/models"}]
    body["spec"]["warmPool"] = {"size": 1}
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    wait_for(
        lambda: _condition(custom, namespace, "lc", "Degraded").get("status") == "True",
        timeout_s=DEADLINE_S,
        what="Degraded=True",
    )
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "lc", {"spec": {"server": {"volumeMounts": []}, "replicas": 2}}
    )
    wait_for(
        lambda: (
            (c := _condition(custom, namespace, "lc", "Ready")).get("status") == "True"
            and c["message"].startswith("2/2 active ready, 1/1 warm ready")
        ),
        timeout_s=DEADLINE_S,
        what="Ready=True with 2 active and 1 warm",
    )
    time.sleep(6)  # a resync timer run (5 s here) and the pod events of readiness: the routine
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "lc")
    wait_for(
        lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
        timeout_s=DEADLINE_S,
        what="the pool deleted (finalizer removed)",
    )

    lines = [line for line in operator_log.read_text().splitlines() if line.strip()]
    assert lines
    unstamped = [line for line in lines if not LINE.match(line)]
    assert not unstamped, f"lines without a UTC time and a level: {unstamped[:5]}"
    routine = [line for line in lines if "succeeded." in line or "is processed:" in line]
    assert not routine, f"routine lines at the default level: {routine[:5]}"
    warnings = [line for line in lines if re.search(r"Z (WARNING|ERROR|CRITICAL) ", line)]
    anonymous = [line for line in warnings if f"{namespace}/lc" not in line]
    assert not anonymous, f"warnings that do not name the pool: {anonymous[:5]}"
    refused = [line for line in warnings if 'Not found: "weights"' in line]
    assert refused, f"no warning carries the API server's message; warnings: {warnings[:5]}"
    assert "refused Deployment lc" in refused[0]
    assert len(refused) == 1, f"the same refusal logged {len(refused)} times at WARNING"
