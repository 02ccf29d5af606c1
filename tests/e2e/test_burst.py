"""A 3x burst: capacity refusals with Retry-After, the scaler asks for more, warm replicas are
promoted in about a second, refusals fall back under the target."""

import time

import aiohttp

from tests.cluster.conftest import wait_for
from tests.e2e.conftest import TARGET_CAPACITY_REJECT_RATE, pool_body, replica_capacity_rps
from tests.e2e.harness import load
from tidegate.api import constants

TARGET = TARGET_CAPACITY_REJECT_RATE


async def test_burst_scales_out_by_promoting_warm_replicas(pools, endpoints) -> None:
    name = pools.create(pool_body("burst", replicas=1, warm=2, max_replicas=3))
    pools.wait_serving(name, active=1, warm=2)
    warm_before = {n for n, r in pools.roles(name).items() if r == constants.ROLE_WARM}
    keda = pools.keda(name)
    base_rps = 0.6 * replica_capacity_rps()  # 60% of the one serving replica
    tenants = {"acme": 0.5, "globex": 0.3, "initech": 0.2}

    async with aiohttp.ClientSession() as http:
        client = load.Client(endpoints(name), http)
        await client.rate({t: base_rps * s for t, s in tenants.items()}, duration_s=4)
        burst_start = time.monotonic()
        await client.rate({t: 3 * base_rps * s for t, s in tenants.items()}, duration_s=26)
        burst_end = time.monotonic()
        await client.drain()

    # Users saw capacity refusals during the burst, each telling them when to retry.
    burst = load.window(client.results, burst_start, burst_end)
    refused = [r for r in burst if r.capacity_rejected]
    assert refused, "a 3x burst on one replica was never refused"
    assert all(r.retry_after and r.retry_after.isdigit() and int(r.retry_after) >= 1 for r in refused)
    assert not any(r.policy_rejected for r in client.results), "no tenant is over a quota here"

    # The scaler asked for more replicas and KEDA's stand-in wrote them to /scale.
    ups = [w for w in keda.writes if w.after > w.before]
    assert ups and max(w.after for w in ups) == 3, f"scale writes: {keda.writes}"
    first_up = ups[0]
    assert first_up.t_s >= burst_start

    # Warm (pre-loaded) replicas took the traffic: promoted, not new cold pods.
    promoted = {n: p for n, p in pools.launcher.agent.running(name).items() if n in warm_before}
    assert len(promoted) == 2 and all(p.role == constants.ROLE_ACTIVE for p in promoted.values())
    # each promoted pod answers the latest scale-up written before it became ready
    seconds = sorted(
        p.ready_since - max(w.t_s for w in ups if w.t_s <= p.ready_since)
        for p in promoted.values()
        if p.ready_since is not None and p.ready_since >= first_up.t_s
    )
    print(f"\nscale writes: {[(round(w.t_s - burst_start, 1), w.before, w.after) for w in keda.writes]}")
    print(f"/scale write -> promoted warm pod answering /readyz 200 as active: {[f'{s:.2f} s' for s in seconds]}")
    assert seconds and max(seconds) < 5.0

    # Once the promoted replicas serve, refusals fall back under the scaler's target.
    settled = load.window(client.results, burst_end - 8, burst_end)
    rate = load.capacity_reject_rate(settled)
    before = load.capacity_reject_rate(load.window(client.results, burst_start, first_up.t_s))
    print(f"capacity reject rate: {before:.0%} before the scale-up, {rate:.1%} in the burst's last 8 s "
          f"({len(settled)} requests)")  # fmt: skip
    assert rate <= TARGET

    # `kubectl get inferencepool` shows why: the scaler's last decision, as the operator reports it.
    signal = wait_for(lambda: pools.get(name).get("status", {}).get("signal"), timeout_s=15, what="status.signal")
    print(f"status.signal: {signal}")
    assert signal.get("reason")
