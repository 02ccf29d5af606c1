"""One tenant at 10x its quota: 429s for that tenant only, the others unaffected, and no GPU
bought: the real KEDA keeps asking the scaler, the real HPA keeps the pool at one replica.

The quota is per replica (README, ``admission``): every serving replica's sidecar keeps its own
bucket, so with the warm replica serving (``spec.warmPool.serve``, the default) the tenant gets two
quotas through, and the refusals expected are derived from the number of serving replicas."""

import time

import aiohttp

from tests.cluster.conftest import wait_for
from tests.e2e.conftest import (
    MAX_TOKENS,
    NOISY,
    NOISY_BURST_TOKENS,
    NOISY_QUOTA_TOKENS_PER_S,
    pool_body,
    request_cost_tokens,
)
from tests.e2e.harness import load
from tidegate.admission.reasons import Reason
from tidegate.sim import tokenizer

DURATION_S = 30  # six syncs of the HPA (5 s on the local cluster)


async def test_noisy_tenant_is_refused_alone_and_buys_no_replicas(pools, endpoints) -> None:
    name = pools.create(pool_body("noisy", replicas=1, warm=1, max_replicas=3))
    pools.wait_serving(name, active=1, warm=1)
    # the warm replica serves too (the default): two replicas behind the Service, two quotas
    wait_for(lambda: len(endpoints(name)()) == 2, what="the active and the warm replica behind the Service")
    serving = len(endpoints(name)())
    hpa = pools.real_keda(name)
    quota_rps = NOISY_QUOTA_TOKENS_PER_S / request_cost_tokens()  # one replica, by reservation
    rates = {"acme": 0.6, "globex": 0.6, NOISY: 10 * quota_rps}

    async with aiohttp.ClientSession() as http:
        client = load.Client(endpoints(name), http)
        start = time.monotonic()
        await client.rate(rates, duration_s=DURATION_S)
        await client.drain()
    decisions = [d for d in hpa.decisions if d.t_s >= start]

    noisy = [r for r in client.results if r.tenant == NOISY]
    others = [r for r in client.results if r.tenant != NOISY]
    refused = [r for r in noisy if r.status == 429]
    print(f"\n{NOISY}: {len(refused)}/{len(noisy)} refused (429) on {serving} serving replicas; others: "
          f"{sum(r.status == 200 for r in others)}/{len(others)} served; scaler decisions seen "
          f"{[(round(d.t_s - start, 1), d.desired, d.text) for d in decisions][:8]}; "
          f"HPA desiredReplicas {sorted({d for _, d in hpa.hpa_desired})}")  # fmt: skip
    # The noisy tenant gets 429 with a policy reason and a Retry-After: all it sends beyond what the
    # buckets of the serving replicas let through, each its burst plus the quota over the run, in
    # requests charged by usage (the sim-backend's prompt tokens + the output, less than the
    # reservation), plus one request per bucket taken while it still held a token.
    charged = tokenizer.count(tokenizer.render_chat([{"role": "user", "content": load.PROMPT}])) + MAX_TOKENS
    per_replica = (NOISY_BURST_TOKENS + NOISY_QUOTA_TOKENS_PER_S * DURATION_S) / charged + 1
    assert len(refused) >= len(noisy) - serving * per_replica, (len(noisy), serving, per_replica)
    assert {r.reason for r in refused} == {Reason.TENANT_RATE.value}
    assert all(r.policy_rejected and r.retry_after for r in refused)
    # Everyone else is served in full, as if the noisy tenant were not there.
    assert others and all(r.status == 200 and r.done for r in others)
    # Policy refusals never buy GPUs: KEDA kept asking (a decision per HPA sync or so), the scaler
    # kept answering one replica, the HPA wanted one, and /scale was never written.
    assert len(decisions) >= 3, decisions
    assert all(d.desired == 1 for d in decisions), decisions
    assert {d for t, d in hpa.hpa_desired if t >= start} == {1}
    assert hpa.writes == []
