"""Load stops: the real KEDA and the real HPA controller scale the pool down once the scaling law's
cooldown and the HPA's scale-down window have passed, and the replica taken out of service finishes
the stream it was serving (draining, not cut). The warm replica serves (the default
``spec.warmPool.serve``): it holds a stream too, and keeps serving through the scale-down.

Nothing in the scale-down path is compressed but the HPA controller's sync period (5 s, a flag of
the local cluster): the HPA keeps the highest recommendation of the operator's 60 s window
(``SCALE_DOWN_WINDOW_S``) and then removes one pod a minute. So the streams that must outlast the
scale-down are long (~90 s) and cheap (a short prompt: the scaler must still size the pool at one
replica while they run), and the pool decodes at half the tier's usual rate to make them so.
"""

import asyncio
import time

import aiohttp

from tests.cluster.conftest import wait_for
from tests.e2e.conftest import (
    BATCH_SLOWDOWN,
    MAX_CONCURRENCY,
    MAX_TOKENS,
    TOKEN_BUDGET,
    pool_body,
    request_cost_tokens,
)
from tests.e2e.harness import load
from tidegate.api import constants
from tidegate.api.scaling import ScalingSpec
from tidegate.operator.builders.scaled_object import SCALE_DOWN_WINDOW_S

COOLDOWN_S = 3  # the scaling law's cooldown
DECODE_TPS = 2.0  # this pool's decode rate per sequence (the tier's usual is 4)
HPA_SYNC_S = 5  # --horizontal-pod-autoscaler-sync-period of the local cluster (e2e/cluster/cluster.sh)
LONG_TOKENS = 180  # ~90 s at DECODE_TPS: outlasts the HPA's window after the scaler asks for one replica
SHORT_PROMPT = "hi"  # reserves ~6 prompt tokens: three long streams hold ~560 of one replica's 1024


async def test_scale_down_through_the_real_hpa_keeps_in_flight_streams(pools, endpoints) -> None:
    body = pool_body("calm", replicas=2, min_replicas=1, warm=1, max_replicas=3, cooldown_s=COOLDOWN_S)
    args = body["spec"]["server"]["args"]
    args[args.index("--decode-tps") + 1] = str(DECODE_TPS)
    name = pools.create(body)
    pools.wait_serving(name, active=2, warm=1)
    wait_for(lambda: len(endpoints(name)()) == 3, what="the two active and the warm replica serving")

    # Load that one replica's token budget cannot hold at the default target utilisation (0.85) and
    # two can: ~4.3 s per request on a replica holding ~4 sequences, 3 req/s -> ~13 requests of 101
    # tokens in flight, 1,300 / (1,024 x 0.85) -> 2 active replicas, no refusal on three serving ones.
    seconds = MAX_TOKENS * (1 + BATCH_SLOWDOWN * 3) / DECODE_TPS
    target = ScalingSpec().target_utilization  # the pool leaves it at its default
    assert 1.2 < 3.0 * seconds * request_cost_tokens() / (TOKEN_BUDGET * target) < 1.8
    assert 3.0 * seconds / 3 < MAX_CONCURRENCY
    async with aiohttp.ClientSession() as http:
        client = load.Client(endpoints(name), http)
        # Traffic first: the HPA starts from the pool's 2 replicas and keeps them while it flows.
        traffic = asyncio.create_task(client.rate({"acme": 1.5, "globex": 1.5}, duration_s=20))
        hpa = await asyncio.to_thread(pools.real_keda, name)
        await traffic
        stopped = time.monotonic()  # the last request was sent
        await client.drain()
        assert not [w for w in hpa.writes if w.t_s <= stopped], f"scaled while the load ran: {hpa.writes}"
        assert hpa.replicas() == 2
        assert all(r.status == 200 for r in client.results), {(r.status, r.reason) for r in client.results}

        def asks_one():
            return next((d for d in hpa.decisions if d.t_s >= stopped and d.desired == 1), None)

        asked = await asyncio.to_thread(wait_for, asks_one, 30, 0.2, "the scaler asking for one replica")
        # One long stream on each serving replica, started before any scale-down: the two active
        # replicas and the serving warm one.
        urls = endpoints(name)()
        assert len(urls) == 3
        running = pools.launcher.agent.running(name).values()
        warm_url = next(p.url for p in running if p.role == constants.ROLE_WARM)
        assert warm_url in urls
        streams = {url: client.start("acme", LONG_TOKENS, url=url, prompt=SHORT_PROMPT) for url in urls}

        def scaled_down():
            return next((w for w in hpa.writes if w.after < w.before), None)

        try:
            write = await asyncio.to_thread(
                wait_for, scaled_down, SCALE_DOWN_WINDOW_S + 45, 0.2, "the scale-down write"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; decisions {hpa.decisions[-3:]}; errors {hpa.errors[-3:]}") from None
        assert write.before == 2 and write.after == 1, hpa.writes
        # The HPA held the highest recommendation of its window: 60 s from its last sync that still
        # saw the load (at most one sync period and the law's cooldown before the load stopped).
        assert write.t_s - stopped >= SCALE_DOWN_WINDOW_S - HPA_SYNC_S - COOLDOWN_S, (write, stopped)

        def draining():
            pods = pools.launcher.agent.running(name).values()
            return next((p for p in pods if p.role == constants.ROLE_DRAINING), None)

        drained = await asyncio.to_thread(wait_for, draining, 15, 0.1, "a draining replica")
        drain_seen = time.monotonic()
        assert not streams[drained.url].done(), "the drained replica's stream should still be in flight"
        results = await asyncio.wait_for(asyncio.gather(*streams.values()), timeout=110)

    # Every stream ran to its end: all tokens and the [DONE] marker, including the drained replica's.
    assert all(r.status == 200 and r.tokens == LONG_TOKENS and r.done for r in results), results
    # Then the pool is one active and one warm replica, the warm one serving: two endpoints. The
    # warm pool was full, so the drained replica is the one removed (its GPU freed), not a warm one.
    wait_for(lambda: drained.name not in pools.roles(name), timeout_s=30, what="the drained replica removed")
    pools.wait_serving(name, active=1, warm=1, timeout_s=30)
    wait_for(lambda: len(endpoints(name)()) == 2, timeout_s=15, what="the active and the warm replica serving")
    assert warm_url in endpoints(name)(), "the warm replica kept serving through the scale-down"
    print(f"\nload stopped -> scaler asks for 1: {asked.t_s - stopped:.1f} s (cooldown {COOLDOWN_S} s); "
          f"-> the real HPA's scale-down write {write.t_s - stopped:.1f} s (window {SCALE_DOWN_WINDOW_S} s); "
          f"write -> draining seen {drain_seen - write.t_s:.2f} s; drained stream ended "
          f"{results[list(streams).index(drained.url)].ended_s - drain_seen:.1f} s after draining began, "
          f"then removed (the serving warm pool full)")  # fmt: skip
