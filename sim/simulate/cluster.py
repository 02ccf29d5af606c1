"""The pool's pods over virtual time: cold start, warm pool, promotion, draining, loss, GPU-seconds.

A pod is created *pending* (a GPU node is provisioned, then the model loads; both drawn from the
scenario's distributions), becomes *ready* with role ``warm``, and serves once promoted to
``active`` (after ``promotion_s``, the Service picking it up). Which pods to promote, drain or
return to warm, and how many pods the Deployment wants, is decided by the operator's own pure
planner, :func:`tidegate.operator.warm_pool.plan`, for every policy (a baseline has a warm pool of 0,
which makes the planner behave like a plain Deployment: new pods serve once ready).

With ``serve_warm`` (``spec.warmPool.serve``) a warm pod is in the Service too: from the moment it is
Ready (the operator labels a new pod ``tidegate.dev/serving=true`` in the reconcile after it is
created, minutes before its model is loaded), and ``promotion_s`` after a drained pod returns to the
warm pool (a relabel, as for a promotion). A promoted warm pod serves on without a gap.

Deployment semantics (the ReplicaSet): too few live pods -> create pending ones; too many -> delete
warm pods in the ReplicaSet's order (kube-controller-manager ``ActivePodsWithRanks``): not Ready
first, then the lowest ``controller.kubernetes.io/pod-deletion-cost``, then the newest. The operator
(``tidegate.operator.warm_pool.after_drain``) leaves a drained pod the warm pool has no room for
(Ready warm pods already fill it) at the draining cost, below a warm pod's, so the drained pod, which
holds nothing in flight (or ran past the drain timeout), goes before any warm one, serving or not;
the pods it keeps are Ready first, then the longest-lived. Active and draining pods are never deleted
by the ReplicaSet (the planner drains them first).

GPU accounting: every live pod holds ``gpus_per_replica`` GPUs on its own node from the moment it is
created (the node is being paid for while it provisions) until it is deleted or lost. Nodes are
not reused after a pod goes (Karpenter consolidation is taken as immediate).

Pure: times come from the simulator.
"""

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tidegate.api import constants
from tidegate.operator import names, warm_pool
from tidegate.sim.replica import ReplicaConfig, ReplicaModel
from tidegate.sim.simulate.lean_replica import LeanReplica
from tidegate.sim.simulate.scenario import Cluster


@dataclasses.dataclass(eq=False)
class Pod:
    """One pod of the pool. ``front``: the policy's per-pod state (tidegate: the sidecar's engine)."""

    name: str
    created_s: float
    ready_at_s: float
    role: str = constants.ROLE_WARM
    ready: bool = False
    serving: bool = False
    deleted_s: float | None = None
    lost: bool = False
    draining_since_s: float | None = None
    replica: ReplicaModel | None = None
    front: Any = None
    running: dict[int, Any] = dataclasses.field(default_factory=dict)  # request id -> Request
    step_at_s: float | None = None
    busy_samples: list[int] = dataclasses.field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.deleted_s is None

    @property
    def warm_ready(self) -> bool:
        return self.live and self.ready and self.role == constants.ROLE_WARM

    def gpu_seconds(self, end_s: float) -> float:
        """Seconds this pod held its node within ``[0, end_s]``."""
        stop = end_s if self.deleted_s is None else min(self.deleted_s, end_s)
        return max(0.0, stop - max(0.0, self.created_s))


class Pool:
    """The pods of one pool and the Deployment/operator logic that moves them (module docstring).

    ``schedule(time_s, kind, payload)`` is the simulator's event scheduler: the pool asks for
    ``("pod_ready", pod)`` and ``("serving", pod)`` events and the simulator calls back
    :meth:`pod_ready` / :meth:`start_serving`.
    """

    def __init__(
        self,
        cluster: Cluster,
        replica: ReplicaConfig,
        rng: np.random.Generator,
        schedule: Callable[[float, str, Any], None],
        drain_timeout_s: float,
        serve_warm: bool = False,
    ) -> None:
        self.cluster, self.replica_config, self.rng = cluster, replica, rng
        self.schedule = schedule
        self.drain_timeout_s = drain_timeout_s
        self.serve_warm = serve_warm
        self.pods: list[Pod] = []
        self._next = 0
        self.on_ready: Callable[[Pod], None] = lambda pod: None

    def live_pods(self) -> Iterator[Pod]:
        return (p for p in self.pods if p.live)

    def serving(self) -> list[Pod]:
        """Pods in the Service now (active and promoted, or warm and Ready with ``serve_warm``; not lost)."""
        return [p for p in self.pods if p.serving and p.live]

    def count(self, role: str, ready: bool | None = None) -> int:
        return sum(1 for p in self.live_pods() if p.role == role and (ready is None or p.ready == ready))

    def create(self, now_s: float, ready_now: bool = False) -> Pod:
        """A new pod; pending for node provisioning + model load unless ``ready_now`` (initial pods)."""
        self._next += 1
        delay = 0.0
        if not ready_now:
            delay = self.cluster.node_provisioning_s.sample(self.rng) + self.cluster.model_load_s.sample(self.rng)
        pod = Pod(name=f"pod-{self._next:04d}", created_s=now_s if not ready_now else 0.0, ready_at_s=now_s + delay)
        self.pods.append(pod)
        if ready_now:
            self.pod_ready(pod, now_s)
        else:
            self.schedule(now_s + delay, "pod_ready", pod)
        return pod

    def pod_ready(self, pod: Pod, now_s: float) -> None:
        if not pod.live:
            return
        pod.ready = True
        pod.replica = LeanReplica(self.replica_config, start_s=now_s)
        self.on_ready(pod)
        if self.serve_warm and pod.role == constants.ROLE_WARM:
            pod.serving = True  # labelled serving long before: an endpoint once Ready

    def start_serving(self, pod: Pod) -> None:
        if pod.live and (pod.role == constants.ROLE_ACTIVE or (self.serve_warm and pod.warm_ready)):
            pod.serving = True

    def delete(self, pod: Pod, now_s: float, lost: bool = False) -> None:
        pod.deleted_s, pod.lost, pod.serving = now_s, lost, False

    def reconcile(self, now_s: float, desired_active: int, warm_size: int, in_flight: Callable[[Pod], int]) -> None:
        """One operator reconcile plus the ReplicaSet's reaction (module docstring)."""
        live = list(self.live_pods())
        views = [
            warm_pool.PodView(
                name=p.name,
                role=p.role,
                ready=p.ready,
                created_s=p.created_s,
                draining_since_s=p.draining_since_s,
                in_flight=in_flight(p) if p.ready else 0,
            )
            for p in live
        ]
        plan = warm_pool.plan(views, desired_active, warm_size, now_s, self.drain_timeout_s)
        by_name = {p.name: p for p in live}
        for name in plan.promote:
            pod = by_name[name]
            pod.role, pod.draining_since_s = constants.ROLE_ACTIVE, None
            self.schedule(now_s + self.cluster.promotion_s, "serving", pod)
        for name in plan.drain:
            pod = by_name[name]
            pod.role, pod.serving, pod.draining_since_s = constants.ROLE_DRAINING, False, now_s
        removed = set(warm_pool.after_drain(views, plan, warm_size).removed)  # as the operator marks them
        for name in plan.return_to_warm:
            pod = by_name[name]
            pod.role, pod.draining_since_s = constants.ROLE_WARM, None
            if self.serve_warm and name not in removed and pod.ready:
                self.schedule(now_s + self.cluster.promotion_s, "serving", pod)
        live = list(self.live_pods())
        missing = plan.deployment_replicas - len(live)
        for _ in range(missing):
            self.create(now_s)
        if missing < 0:
            spare = [p for p in live if p.role == constants.ROLE_WARM]

            def cost(p: Pod) -> int:
                return names.COST_DRAINING if p.name in removed else names.COST_WARM

            spare.sort(key=lambda p: (p.ready, cost(p), -p.created_s))  # the ReplicaSet's order (module docstring)
            for pod in spare[:-missing]:
                self.delete(pod, now_s)

    def gpu_hours(self, end_s: float) -> float:
        """GPU-hours held within ``[0, end_s]``."""
        return sum(p.gpu_seconds(end_s) for p in self.pods) * self.cluster.gpus_per_replica / 3600.0
