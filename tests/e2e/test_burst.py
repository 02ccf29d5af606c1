"""A 3x burst, scaled by the real KEDA and the real HPA controller: capacity refusals with
Retry-After, the scaler asks for more, the HPA writes ``/scale``, warm replicas are promoted in
about a second, refusals fall back under the target, and the real Karpenter launches GPU nodes
for the replicas that refill the warm pool.

Nothing in the scaling path is compressed but the HPA controller's sync period (5 s, a flag of
the local cluster; 15 s by default): KEDA's metrics API server, the HPA's tolerance, scale-up
policy (``maxScaleUpStep`` pods per ``pollingIntervalSeconds``) and stabilisation are the real
ones.
"""

import datetime
import time

import aiohttp
import kubernetes

from tests.cluster.conftest import wait_for
from tests.e2e.conftest import TARGET_CAPACITY_REJECT_RATE, pool_body, replica_capacity_rps
from tests.e2e.harness import load
from tidegate.api import constants

TARGET = TARGET_CAPACITY_REJECT_RATE


def _ready_at(node: kubernetes.client.V1Node) -> float | None:
    ready = next((c for c in node.status.conditions or [] if c.type == "Ready" and c.status == "True"), None)
    return ready.last_transition_time.timestamp() if ready and ready.last_transition_time else None


async def test_burst_scales_out_through_keda_and_the_hpa_by_promoting_warm_replicas(pools, endpoints) -> None:
    name = pools.create(pool_body("burst", replicas=1, warm=2, max_replicas=3, karpenter=True), keda="real")
    # Three pods, each on a GPU node Karpenter launches for it.
    pools.wait_serving(name, active=1, warm=2, timeout_s=180)
    warm_before = {n for n, r in pools.roles(name).items() if r == constants.ROLE_WARM}
    hpa = pools.real_keda(name)
    base_rps = 0.6 * replica_capacity_rps()  # 60% of the one serving replica
    tenants = {"acme": 0.5, "globex": 0.3, "initech": 0.2}

    async with aiohttp.ClientSession() as http:
        client = load.Client(endpoints(name), http)
        await client.rate({t: base_rps * s for t, s in tenants.items()}, duration_s=4)
        burst_start, burst_wall = time.monotonic(), time.time()
        await client.rate({t: 3 * base_rps * s for t, s in tenants.items()}, duration_s=40)
        burst_end = time.monotonic()
        await client.drain()

    # Users saw capacity refusals during the burst, each telling them when to retry.
    burst = load.window(client.results, burst_start, burst_end)
    refused = [r for r in burst if r.capacity_rejected]
    assert refused, "a 3x burst on one replica was never refused"
    assert all(r.retry_after and r.retry_after.isdigit() and int(r.retry_after) >= 1 for r in refused)
    assert not any(r.policy_rejected for r in client.results), "no tenant is over a quota here"

    # The scaler asked for more replicas, and the real HPA wrote them to /scale.
    ups = [w for w in hpa.writes if w.after > w.before]
    assert ups and max(w.after for w in ups) == 3, f"scale writes: {hpa.writes}; errors {hpa.errors[-3:]}"
    first_up = ups[0]
    assert first_up.t_s >= burst_start
    asked = next((d for d in hpa.decisions if d.t_s >= burst_start and d.desired > 1), None)
    assert asked is not None and asked.t_s <= first_up.t_s + 1.0, hpa.decisions

    # Warm (pre-loaded) replicas took the traffic: promoted, not new cold pods.
    promoted = {n: p for n, p in pools.launcher.agent.running(name).items() if n in warm_before}
    assert len(promoted) == 2 and all(p.role == constants.ROLE_ACTIVE for p in promoted.values())
    # each promoted pod answers the latest scale-up written before it became ready
    seconds = sorted(
        p.ready_since - max(w.t_s for w in ups if w.t_s <= p.ready_since)
        for p in promoted.values()
        if p.ready_since is not None and p.ready_since >= first_up.t_s
    )
    assert seconds and max(seconds) < 5.0

    # Once the promoted replicas serve, refusals fall back under the scaler's target.
    settled = load.window(client.results, burst_end - 8, burst_end)
    rate = load.capacity_reject_rate(settled)
    before = load.capacity_reject_rate(load.window(client.results, burst_start, first_up.t_s))
    assert rate <= TARGET, f"{rate:.1%} refused in the burst's last 8 s"

    # The Deployment grew to refill the warm pool, and Karpenter launched GPU nodes for the new
    # pods (one or more: a 2-GPU type costs the same per GPU as two 1-GPU ones).
    core = kubernetes.client.CoreV1Api(pools.launcher.api_client)
    np_name = f"tidegate-{pools.namespace}-{name}"

    def new_nodes() -> list[tuple[str, float]]:
        nodes = core.list_node(label_selector=f"karpenter.sh/nodepool={np_name}").items
        made = [n for n in nodes if n.metadata.creation_timestamp.timestamp() >= first_up.wall_s - 1]
        gpus = sum(int(n.status.allocatable.get("nvidia.com/gpu", "0")) for n in made if _ready_at(n))
        pending = [p for p in core.list_namespaced_pod(pools.namespace, label_selector=f"{constants.LABEL_POOL}={name}").items
                   if not p.spec.node_name and not p.metadata.deletion_timestamp]  # fmt: skip
        if gpus < 2 or pending:
            return []
        return sorted((n.metadata.labels["node.kubernetes.io/instance-type"], _ready_at(n)) for n in made)

    nodes_ready = wait_for(new_nodes, timeout_s=120, interval_s=1, what="new GPU nodes Ready for the warm refill")

    # `kubectl get inferencepool` shows why: the scaler's last decision, as the operator reports it.
    signal = wait_for(lambda: pools.get(name).get("status", {}).get("signal"), timeout_s=15, what="status.signal")
    assert signal.get("reason")

    def at(t: float) -> str:
        return f"{t - burst_start:.1f} s"

    print(
        f"\nburst at {datetime.datetime.fromtimestamp(burst_wall, datetime.UTC):%H:%M:%S}; scaler decisions "
        f"(seen): {[(at(d.t_s), d.desired) for d in hpa.decisions if d.t_s >= burst_start][:6]}"
    )
    print(f"/scale writes by the real HPA: {[(at(w.t_s), w.before, w.after) for w in hpa.writes]}")
    print(f"burst -> first /scale write: {at(first_up.t_s)}; write -> promoted warm pod serving: "
          f"{[f'{s:.2f} s' for s in seconds]}")  # fmt: skip
    print(f"burst -> new GPU nodes Ready (Karpenter, 1 s resolution): "
          f"{[f'{kind} {t - burst_wall:.0f} s' for kind, t in nodes_ready]}")  # fmt: skip
    print(f"capacity reject rate: {before:.0%} before the scale-up, {rate:.1%} in the burst's last 8 s "
          f"({len(settled)} requests); status.signal: {signal}")  # fmt: skip
