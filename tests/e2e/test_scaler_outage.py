"""Scaler outage: the tidegate scaler is killed while the real KEDA and HPA hold a pool at 3
active replicas under load. The replicas stay (KEDA has no metric, and with the scaler process
down it never enters fallback: KEDA issue #8056), users keep being served by the 3 replicas (and
by the warm ones that refilled the pool, serving under the default ``spec.warmPool.serve``), the
pool's conditions say the scaler is unreachable and that KEDA holds; once the scaler is back the
HPA reads the metric again with no hand repair.

The issue's scenario keeps the scaler down 5 minutes; here OUTAGE_S (60 s: twelve syncs of the
HPA, two polls of KEDA's own loop). A drop would barely show in that time (the HPA's scale-down
window is the operator's 60 s, then one pod a minute); what shows the hold is the HPA itself:
``ScalingActive=False``.
"""

import asyncio
import time

import aiohttp
import kubernetes

from tests.cluster.conftest import wait_for
from tests.e2e.conftest import TARGET_CAPACITY_REJECT_RATE, pool_body, replica_capacity_rps
from tests.e2e.harness import load
from tidegate.api import constants

OUTAGE_S = 60
TENANTS = {"acme": 0.5, "globex": 0.3, "initech": 0.2}


def _condition(pool: dict, ctype: str) -> dict:
    return next((c for c in pool.get("status", {}).get("conditions", []) if c["type"] == ctype), {})


async def test_scaler_killed_at_three_replicas_keeps_them_and_the_pool_says_keda_holds(pools, endpoints) -> None:
    launcher = pools.launcher
    name = pools.create(pool_body("outage", replicas=1, warm=2, max_replicas=3))
    pools.wait_serving(name, active=1, warm=2)
    hpa = pools.real_keda(name)
    autoscaling = kubernetes.client.AutoscalingV2Api(launcher.api_client)

    def scaling_active() -> tuple[str, str]:
        hpa_now = autoscaling.read_namespaced_horizontal_pod_autoscaler(hpa.hpa_name, pools.namespace)
        cond = next(c for c in hpa_now.status.conditions if c.type == "ScalingActive")
        return cond.status, cond.reason

    # Needs 3 active replicas at the scaler's utilisation target. The warm replicas serve (the
    # default), and the scaler sizes the active ones for the load of all of them: 1.8 replicas'
    # worth spread over the three serving replicas is ~5 requests of ~101 tokens in flight on each,
    # 3 x 5 x 101 / (1024 x 0.85) -> 2 active replicas (seen: the scaler asked for 2, no more). 80% of every
    # serving replica's capacity is ~6.4 on each: 3 x 6.4 x 101 / 870 -> 3.
    rps = 0.8 * 3 * replica_capacity_rps()
    async with aiohttp.ClientSession() as http:
        client = load.Client(endpoints(name), http)
        traffic = asyncio.create_task(client.rate({t: rps * s for t, s in TENANTS.items()}, duration_s=OUTAGE_S + 120))
        try:
            # Waits on the watcher's own record of the write, not on a separate read of the pool: the
            # watcher can see the write a poll late, and it must not count as a write during the outage.
            await asyncio.to_thread(
                wait_for,
                lambda: hpa.writes and hpa.writes[-1].after == 3,
                90, 0.5, "the real HPA scaling the pool to 3 under load (as the watcher recorded it)",
            )  # fmt: skip
            # the 3 active replicas serve (the warm ones refilling the pool may be serving beside them)
            agent = launcher.agent
            await asyncio.to_thread(
                wait_for,
                lambda: sum(p.role == constants.ROLE_ACTIVE and p.ready for p in agent.running(name).values()) == 3,
                60, 0.1, "3 active replicas serving",
            )  # fmt: skip
            writes_before = len(hpa.writes)

            launcher.kill_scaler()
            killed = time.monotonic()
            cond = await asyncio.to_thread(
                wait_for,
                lambda: (c := _condition(pools.get(name), "ScalerReachable")) and c["status"] == "False" and c,
                30, 0.5, "ScalerReachable=False",
            )  # fmt: skip
            seen_inactive = await asyncio.to_thread(
                wait_for, lambda: (s := scaling_active())[0] == "False" and s, 60, 1, "the HPA without its metric"
            )
            while time.monotonic() - killed < OUTAGE_S:
                await asyncio.sleep(1)
            held = hpa.writes[writes_before:]
            replicas_at_end = hpa.replicas()
            serving_at_end = len(endpoints(name)())  # the active replicas and the warm ones that serve
            outage = load.window(client.results, killed, time.monotonic() - 5)

            launcher.start_scaler()
            back = time.monotonic()
            await asyncio.to_thread(
                wait_for,
                lambda: _condition(pools.get(name), "ScalerReachable").get("status") == "True",
                30, 0.5, "ScalerReachable=True once the scaler answers",
            )  # fmt: skip
            await asyncio.to_thread(
                wait_for, lambda: scaling_active()[0] == "True", 60, 1, "the HPA reading the metric again"
            )
            recovered_s = time.monotonic() - back
        finally:
            traffic.cancel()
            await client.drain()

    # The pool said what happens: KEDA holds the 3 replicas, and fallback would not start.
    assert cond["reason"] == "KedaHoldsReplicas"
    assert "holds the pool at its current 3 replica(s)" in cond["message"], cond
    assert "KEDA issue #8056" in cond["message"]
    # It held: the HPA had no metric, /scale was never written, 3 replicas kept serving.
    assert seen_inactive == ("False", "FailedGetExternalMetric")
    assert held == [] and replicas_at_end == 3, held
    assert outage and load.capacity_reject_rate(outage) <= TARGET_CAPACITY_REJECT_RATE
    assert all(r.status == 200 for r in outage if not r.capacity_rejected), {r.status for r in outage}
    print(
        f"\nscaler down {OUTAGE_S} s at 3 replicas: /scale writes {held}, replicas {replicas_at_end} "
        f"({serving_at_end} serving with the warm pool); "
        f"{len(outage)} requests, capacity reject {load.capacity_reject_rate(outage):.1%}; HPA {seen_inactive}; "
        f"back: ScalerReachable and the HPA's metric in {recovered_s:.1f} s\nScalerReachable: {cond['message']}"
    )
