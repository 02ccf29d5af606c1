"""Fixtures of the e2e tier: tidegate launched on the local cluster, pools, KEDA.

One :class:`~tests.e2e.harness.launcher.Launcher` per session (chart, operator, scaler, pod
agent, in a namespace of its own); each test makes its own pool there and deletes it afterwards.
Pools scale through the real KEDA and the real HPA controller (e2e/cluster/cluster.sh runs both),
watched by :class:`~tests.e2e.harness.hpa_watch.HpaWatch`. Time is compressed in the pool spec
(1 s polling, 10 s rate window, short cooldowns), in the HPA controller's sync period (a flag of
the local cluster) and in the replica size (a sim-backend "GPU" decoding ~4 tokens/s per
sequence, 8 sequences: a few requests per second saturate it); the HPA's tolerance, stabilisation
windows and rate policies are the real ones.
"""

import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest

from tests.cluster.conftest import api_client, cluster_env, wait_for  # noqa: F401 (fixtures)
from tests.e2e.harness import load
from tests.e2e.harness.hpa_watch import HpaWatch
from tests.e2e.harness.launcher import Launcher
from tidegate.api import GROUP, PLURAL, VERSION, constants
from tidegate.demo import scenario

POLL_INTERVAL_S = 1.0
# The operator waits this long at most for a draining pod's streams (scenario: scale-down keeps streams).
DRAIN_TIMEOUT_S = 60

# One replica, small on purpose: a sim-backend "GPU" decoding DECODE_TPS tokens/s per sequence,
# MAX_CONCURRENCY sequences, so a few requests per second saturate it.
MAX_CONCURRENCY = 8
DECODE_TPS = 4.0
BATCH_SLOWDOWN = 0.02  # extra decode step time per extra sequence (tidegate.sim.replica)
MAX_TOKENS = 8  # output of each request of the load
# The scaler's utilisation reads tokens in flight over the budget: sized to what MAX_CONCURRENCY
# requests hold (~101 tokens each), so a pool busy on concurrency looks busy to the scaler too.
TOKEN_BUDGET = 1024
TARGET_CAPACITY_REJECT_RATE = 0.05  # a 10 s window holds a few dozen requests: 2% is one unlucky refusal
NOISY, NOISY_QUOTA_TOKENS_PER_S, NOISY_BURST_TOKENS = "umbrella", 25.0, 250
TENANT_WEIGHTS = {"acme": 3.0, "globex": 2.0, "initech": 1.0}


def replica_capacity_rps(max_tokens: int = MAX_TOKENS) -> float:
    """Requests/s one full replica completes (decode model of tidegate.sim.replica)."""
    seconds = max_tokens * (1 + BATCH_SLOWDOWN * (MAX_CONCURRENCY - 1)) / DECODE_TPS
    return MAX_CONCURRENCY / seconds


def request_cost_tokens(max_tokens: int = MAX_TOKENS) -> int:
    """What the sidecar reserves for one request of the load: prompt estimate (chars/3 + 4 per
    message, x1.1 safety) + max_tokens."""
    return math.ceil((len(load.PROMPT) / 3 + 4) * 1.1) + max_tokens


def admission() -> dict[str, Any]:
    """The pool's ``spec.admission`` (the shape of the demo's; tenant and priority from headers)."""
    return {
        "tokenBudget": TOKEN_BUDGET,
        "maxConcurrency": MAX_CONCURRENCY,
        "queue": {"maxDepth": 16, "maxWaitMs": 3000},
        "telemetry": {"pollIntervalMs": 250},
        "priorityHeader": scenario.PRIORITY_HEADER,
        "defaultPriorityClass": scenario.INTERACTIVE,
        "priorityClasses": [
            {"name": scenario.INTERACTIVE, "ttftSloMs": 1500, "reservedShare": 0.2, "weight": 4},
            {"name": scenario.BATCH, "ttftSloMs": 30_000, "reservedShare": 0.0, "weight": 1},
        ],
        "tenancy": {
            "identity": "header",
            "header": scenario.TENANT_HEADER,
            "tenants": [{"name": n, "weight": w} for n, w in TENANT_WEIGHTS.items()]
            + [
                {
                    "name": NOISY,
                    "weight": 1.0,
                    "tokensPerSecond": NOISY_QUOTA_TOKENS_PER_S,
                    "burstTokens": NOISY_BURST_TOKENS,
                }
            ],
        },
    }


# The KWOKNodeClass cluster.sh creates: the node class the Karpenter kwok provider serves.
KWOK_NODE_CLASS = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"}


def pool_body(
    name: str,
    replicas: int,
    warm: int,
    max_replicas: int,
    cooldown_s: int = 300,
    min_replicas: int | None = None,
    karpenter: bool = False,
) -> dict[str, Any]:
    """An InferencePool whose model container is ``tidegate sim-backend`` (the pod agent runs it as
    is; the kind launcher's image does too). ``karpenter``: each replica asks for one
    ``nvidia.com/gpu`` and the pool's NodePool has the real Karpenter launch a (kwok) GPU node for it."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "model": {"name": scenario.MODEL, "engine": "vllm", "maxContextTokens": TOKEN_BUDGET},
            "server": {
                "image": os.environ.get("TIDEGATE_E2E_IMAGE", "tidegate:e2e"),
                "command": ["tidegate", "sim-backend"],
                "args": [
                    "--model",
                    scenario.MODEL,
                    "--decode-tps",
                    str(DECODE_TPS),
                    "--batch-slowdown",
                    str(BATCH_SLOWDOWN),
                    "--max-running",
                    "64",
                    "--kv-capacity-tokens",
                    "100000",
                ],
                "port": 8000,
                "gpus": 0,
            },
            "admission": admission(),
            "warmPool": {"size": warm},
            "scaling": {
                "minReplicas": replicas if min_replicas is None else min_replicas,
                "maxReplicas": max_replicas,
                "targetCapacityRejectRate": TARGET_CAPACITY_REJECT_RATE,
                "maxScaleUpStep": 2,
                "scaleDownCooldownSeconds": cooldown_s,
                "pollingIntervalSeconds": int(POLL_INTERVAL_S),
                "signal": {"windowSeconds": 10},
            },
        },
    }
    if karpenter:
        body["spec"]["server"]["gpus"] = 1
        body["spec"]["nodePool"] = {"enabled": True, "nodeClassRef": KWOK_NODE_CLASS}
    return body


@pytest.fixture(scope="session")
def launcher(cluster_env: dict[str, str], tmp_path_factory) -> Iterator[Launcher]:  # noqa: F811
    workdir = tmp_path_factory.mktemp("e2e")
    with Launcher(
        cluster_env["KUBECONFIG"],
        env=cluster_env,
        workdir=workdir,
        operator_env={"TIDEGATE_DRAIN_TIMEOUT_SECONDS": str(DRAIN_TIMEOUT_S)},
    ) as running:
        yield running
        crashes = running.agent.crashes if running.agent else []
        foreign = running.agent.foreign if running.agent else set()
    assert not foreign, (
        f"another operator reconciled the e2e namespace (pods {sorted(foreign)}): other test runs share this "
        "cluster; run the e2e suite alone or on its own cluster (TIDEGATE_CLUSTER_NAME=tidegate-e2e)"
    )
    assert not crashes, f"pod processes exited on their own: {crashes} (logs under {workdir})"


class Pools:
    """Creates pools in the launcher's namespace; deletes them (and waits for their processes) at teardown."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self.custom = kubernetes.client.CustomObjectsApi(launcher.api_client)
        self.core = kubernetes.client.CoreV1Api(launcher.api_client)
        self.names: list[str] = []
        self.watches: list[HpaWatch] = []

    @property
    def namespace(self) -> str:
        return self.launcher.namespace

    def create(self, body: dict[str, Any]) -> str:
        """Create the pool; the real KEDA and HPA scale it (see :meth:`real_keda`)."""
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
        name = body["metadata"]["name"]
        self.names.append(name)
        return name

    def real_keda(self, name: str) -> HpaWatch:
        """Once the real HPA reads the scaler's metric for pool ``name``: a recorder of its ``/scale``
        writes and of the scaler's decisions."""
        watch = HpaWatch(self.launcher.api_client, self.namespace, name, self.launcher.scaler_metrics_url)
        self.watches.append(watch)
        return watch.start()

    def delete(self, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def roles(self, name: str) -> dict[str, str]:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{constants.LABEL_POOL}={name}").items
        return {p.metadata.name: p.metadata.labels.get(constants.LABEL_ROLE, "") for p in pods
                if p.metadata.deletion_timestamp is None}  # fmt: skip

    def wait_serving(self, name: str, active: int, warm: int, timeout_s: float = 60) -> None:
        """Until ``active`` pods serve (sidecar ready as active) and ``warm`` warm pods run processes."""
        agent = self.launcher.agent

        def ok() -> bool:
            running = agent.running(name).values()
            return (
                sum(p.role == constants.ROLE_ACTIVE and p.ready for p in running) == active
                and sum(p.role == constants.ROLE_WARM for p in running) == warm
            )

        wait_for(ok, timeout_s=timeout_s, interval_s=0.1, what=f"{name}: {active} serving and {warm} warm")

    def close(self) -> None:
        for watch in self.watches:
            watch.stop()
        for name in self.names:
            self.delete(name)
        agent = self.launcher.agent
        for name in self.names:
            # a draining pod may hold its stream up to DRAIN_TIMEOUT_S, then the garbage collector and
            # kwok delete the pods: 60 s was seen too short on a loaded machine
            wait_for(lambda n=name: not agent.running(n), timeout_s=120, what=f"processes of {name} gone")


@pytest.fixture
def pools(launcher: Launcher) -> Iterator[Pools]:
    made = Pools(launcher)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def endpoints(launcher: Launcher) -> Callable[[str], Callable[[], list[str]]]:
    return lambda pool: lambda: launcher.agent.endpoints(pool)
