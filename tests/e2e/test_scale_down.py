"""Load stops: the pool scales down after the cooldown, and the replica taken out of service
finishes the stream it was serving (draining, not cut). The warm replica serves (the default
``spec.warmPool.serve``): it holds a stream too, and keeps serving through the scale-down.

Scaled by the KEDA stand-in (tests/e2e/harness/keda.py), not the real KEDA and HPA: the HPA's
scale-down stabilisation window is the operator's 60 s and then one pod a minute, and the real HPA
controller cannot be given a shorter one from outside, so this test compresses it to the cooldown
(3 s) in the stand-in, which runs the HPA's algorithm on the scaler's real answers.
The real KEDA is paused for this pool."""

import asyncio
import time

import aiohttp

from tests.cluster.conftest import wait_for
from tests.e2e.conftest import pool_body
from tests.e2e.harness import load
from tidegate.api import constants

COOLDOWN_S = 3  # the scaling law's cooldown; the HPA's scale-down window is compressed to it too
LONG_TOKENS = 100  # ~25 s at 4 tokens/s: outlasts the rate window, the cooldown and the drain


async def test_scale_down_after_cooldown_keeps_in_flight_streams(pools, endpoints) -> None:
    name = pools.create(
        pool_body("calm", replicas=2, min_replicas=1, warm=1, max_replicas=3, cooldown_s=COOLDOWN_S), keda="stand-in"
    )
    pools.wait_serving(name, active=2, warm=1)

    async with aiohttp.ClientSession() as http:
        client = load.Client(endpoints(name), http)
        # More than one replica can take at the target utilisation, less than two are sized for.
        # KEDA starts polling once traffic flows (an idle new pool would scale down before the load).
        traffic = asyncio.create_task(client.rate({"acme": 2.0, "globex": 2.0}, duration_s=8))
        await asyncio.sleep(3)
        # the HPA's scale-down window: the operator's 60 s, compressed to the cooldown
        keda = await asyncio.to_thread(pools.keda, name, COOLDOWN_S)
        await traffic
        stopped = time.monotonic()  # the last request was sent
        await client.drain()
        # One long stream on each serving replica, started before any scale-down: the two active
        # replicas and the serving warm one.
        urls = endpoints(name)()
        assert len(urls) == 3
        running = pools.launcher.agent.running(name).values()
        warm_url = next(p.url for p in running if p.role == constants.ROLE_WARM)
        assert warm_url in urls
        streams = {url: client.start("acme", LONG_TOKENS, url=url) for url in urls}

        def scaled_down():
            return next((w for w in keda.writes if w.after < w.before), None)

        try:
            write = await asyncio.to_thread(wait_for, scaled_down, 40, 0.2, "the scale-down write")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last polls {keda.polls[-3:]}; failures {keda.failures[-3:]}") from None
        assert write.before == 2 and write.after == 1
        assert write.t_s - stopped >= COOLDOWN_S

        def draining():
            pods = pools.launcher.agent.running(name).values()
            return next((p for p in pods if p.role == constants.ROLE_DRAINING), None)

        drained = await asyncio.to_thread(wait_for, draining, 15, 0.1, "a draining replica")
        drain_seen = time.monotonic()
        assert not streams[drained.url].done(), "the drained replica's stream should still be in flight"
        results = await asyncio.wait_for(asyncio.gather(*streams.values()), timeout=60)

    # Every stream ran to its end: all tokens and the [DONE] marker, including the drained replica's.
    assert all(r.status == 200 and r.tokens == LONG_TOKENS and r.done for r in results), results
    # Then the pool is one active and one warm replica, the warm one serving: two endpoints. The
    # warm pool was full, so the drained replica is the one removed (its GPU freed), not a warm one.
    wait_for(lambda: drained.name not in pools.roles(name), timeout_s=30, what="the drained replica removed")
    pools.wait_serving(name, active=1, warm=1, timeout_s=30)
    wait_for(lambda: len(endpoints(name)()) == 2, timeout_s=15, what="the active and the warm replica serving")
    assert warm_url in endpoints(name)(), "the warm replica kept serving through the scale-down"
    print(f"\nload stopped -> scale-down write {write.t_s - stopped:.1f} s (cooldown {COOLDOWN_S} s); "
          f"write -> draining seen {drain_seen - write.t_s:.2f} s; drained stream ended "
          f"{results[list(streams).index(drained.url)].ended_s - drain_seen:.1f} s after draining began, "
          f"then removed (the serving warm pool full)")  # fmt: skip
