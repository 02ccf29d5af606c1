"""The discrete-event simulator: virtual time, one event heap, every request settled exactly once.

Events, in time order (ties in the order they were scheduled): arrivals (drawn up front by
:mod:`~.workload`), replica engine steps (each pod's :class:`~tidegate.sim.replica.ReplicaModel`
says when its step ends), client timeouts, pods becoming ready or serving, the control loop (one HPA
sync every ``scaling.pollingIntervalSeconds``), the operator's reconcile (on every change and every
5 s), the policy's periodic tick (0.1 s, the sidecar's upkeep), a 1 s sampler (GPU busy, timeline)
and the scenario's faults.

Every request ends in exactly one :class:`Outcome` (conservation; :meth:`Simulator.settle` raises
:class:`DoubleSettle` otherwise): ``served`` (last token out), ``refused`` (by admission, a gateway,
or no endpoint; with a reason), ``timed_out`` (the client gave up before its first token:
``client_timeout_s`` of its class), ``lost`` (its replica died under it). Arrivals stop at
``duration_s``; the run then drains for at most ``drain_limit_s`` and settles what is left as
``timed_out`` (reason ``run_end``). GPU-hours are counted over ``[0, duration_s]``.

Pure: no wall clock, no I/O; the same seed gives the same run.
"""

import dataclasses
import heapq
import itertools
from enum import StrEnum
from typing import Any

import numpy as np

from tidegate.api import constants
from tidegate.sim.replica import EventKind
from tidegate.sim.simulate import workload
from tidegate.sim.simulate.cluster import Pod, Pool
from tidegate.sim.simulate.hpa import Hpa
from tidegate.sim.simulate.scenario import Scenario

TICK_S = 0.1
RECONCILE_S = 5.0
SAMPLE_S = 1.0


class Outcome(StrEnum):
    SERVED = "served"
    REFUSED = "refused"
    TIMED_OUT = "timed_out"
    LOST = "lost"


class DoubleSettle(Exception):
    """A request was settled twice (a conservation bug)."""


@dataclasses.dataclass(eq=False, slots=True)
class Request:
    """One request and what happened to it (times in virtual seconds)."""

    id: int
    arrival_s: float
    stream: int
    tenant: str
    priority: str
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    pod: Pod | None = None
    ticket: Any = None
    started_s: float | None = None
    first_token_s: float | None = None
    done_s: float | None = None
    outcome: Outcome | None = None
    reason: str = ""

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s


@dataclasses.dataclass
class ScaleAction:
    time_s: float
    before: int
    after: int


class Simulator:
    """One run of ``policy`` on ``scenario`` with ``seed``. ``run()`` returns the simulator itself,
    whose ``requests``, ``actions``, ``timeline`` and ``pool`` the report reads."""

    def __init__(self, scenario: Scenario, policy: Any, seed: int = 0) -> None:
        self.scenario, self.policy, self.seed = scenario, policy, seed
        self.now = 0.0
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        self.arrivals = workload.generate(scenario, seed)
        self.requests: list[Request] = []
        self.open = 0
        self.actions: list[ScaleAction] = []
        self.timeline: list[dict[str, float]] = []
        self.preemptions = 0
        scaling = scenario.scaling
        self.hpa = Hpa(scaling.min_replicas, scaling.max_replicas, policy.hpa_behavior(scenario))
        self.hpa.seed(0.0, scenario.cluster.initial_replicas)  # the run starts from a steady state, not a fresh HPA
        policy.setup(self)
        self.pool = Pool(
            scenario.cluster,
            scenario.replica,
            np.random.default_rng([seed, 1]),
            self.schedule,
            drain_timeout_s=float(scenario.admission.request_timeout_seconds),
            serve_warm=policy.serve_warm,
        )
        self.fault_rng = np.random.default_rng([seed, 2])
        self.pool.on_ready = lambda pod: policy.attach(self, pod)
        self.desired = scenario.cluster.initial_replicas + policy.headroom  # spec.replicas
        for i in range(self.desired + policy.warm_pool):
            pod = self.pool.create(0.0, ready_now=True)
            if i < self.desired:
                pod.role, pod.serving = constants.ROLE_ACTIVE, True

    # ---- scheduling --------------------------------------------------------------------
    def schedule(self, time_s: float, kind: str, payload: Any = None) -> None:
        heapq.heappush(self._heap, (time_s, next(self._seq), kind, payload))

    def run(self) -> "Simulator":
        sc = self.scenario
        self.schedule(sc.scaling.polling_interval_seconds, "hpa")
        self.schedule(RECONCILE_S, "reconcile")
        self.schedule(SAMPLE_S, "sample")
        if self.policy.ticks:
            self.schedule(TICK_S, "tick")
        for fault in sc.faults:
            self.schedule(fault.at_s, "fault", fault)
        arrivals, n = self.arrivals, len(self.arrivals)
        times = arrivals.time_s.tolist()
        i = 0
        end_s = sc.duration_s + sc.drain_limit_s
        while True:
            next_arrival = times[i] if i < n else float("inf")
            if self._heap and self._heap[0][0] <= next_arrival:
                t, _, kind, payload = heapq.heappop(self._heap)
                if i >= n and (self.open == 0 or t > end_s):
                    break
                self.now = t
                getattr(self, f"_on_{kind}")(payload)
            elif i < n:
                self.now = next_arrival
                self._arrive(i)
                i += 1
            else:
                break
        for req in self.requests:
            if req.outcome is None:
                self.settle(req, Outcome.TIMED_OUT, "run_end")
        return self

    # ---- requests ----------------------------------------------------------------------
    def _arrive(self, i: int) -> None:
        a = self.arrivals
        stream = self.scenario.streams[int(a.stream[i])]
        req = Request(
            id=i,
            arrival_s=self.now,
            stream=int(a.stream[i]),
            tenant=stream.tenant,
            priority=stream.priority,
            prompt_tokens=int(a.prompt_tokens[i]),
            output_tokens=int(a.output_tokens[i]),
            max_tokens=int(a.max_tokens[i]),
        )
        self.requests.append(req)
        self.open += 1
        timeout = self.scenario.client_timeout_s.get(req.priority)
        if timeout is not None:
            self.schedule(self.now + timeout, "timeout", req)
        self.policy.on_arrival(self, req)

    def settle(self, req: Request, outcome: Outcome, reason: str = "") -> None:
        """End ``req`` with ``outcome``; raises :class:`DoubleSettle` if it had ended already."""
        if req.outcome is not None:
            raise DoubleSettle(f"request {req.id} settled as {req.outcome} and again as {outcome}")
        req.outcome, req.reason = outcome, reason
        self.open -= 1

    def refuse(self, req: Request, reason: str) -> None:
        self.settle(req, Outcome.REFUSED, reason)

    def start(self, req: Request, pod: Pod) -> None:
        """Hand ``req`` to ``pod``'s model server now."""
        assert pod.replica is not None and pod.live
        req.pod, req.started_s = pod, self.now
        pod.running[req.id] = req
        pod.replica.submit(req.id, req.prompt_tokens, req.output_tokens, self.now)
        self.sync(pod)

    def sync(self, pod: Pod) -> None:
        """Catch ``pod``'s replica up to now, apply its events, and book its next step."""
        replica = pod.replica
        if replica is None or not pod.live:
            return
        for event in replica.advance(self.now):
            if event.kind is EventKind.TOKEN:
                if event.index == 0:
                    req = pod.running[event.seq_id]
                    req.first_token_s = event.time_s
                    self.policy.on_first_token(self, req, pod)
            elif event.kind is EventKind.FINISHED:
                req = pod.running.pop(event.seq_id)
                replica.release(event.seq_id)
                req.done_s = event.time_s
                self.settle(req, Outcome.SERVED)
                self.policy.on_finish(self, req, pod)
            elif event.kind is EventKind.PREEMPTED:
                self.preemptions += 1
        nxt = replica.next_event_s
        if nxt is not None and nxt != pod.step_at_s:
            pod.step_at_s = nxt
            self.schedule(nxt, "step", pod)

    def _on_step(self, pod: Pod) -> None:
        if pod.step_at_s == self.now:
            pod.step_at_s = None
            self.sync(pod)

    def _on_timeout(self, req: Request) -> None:
        if req.outcome is not None:
            return
        pod = req.pod
        if pod is not None and req.id in pod.running:
            self.sync(pod)
            if req.first_token_s is not None or req.outcome is not None:
                return  # streaming has begun: the client keeps reading
            pod.replica.abort(req.id, self.now)
            pod.replica.release(req.id)
            del pod.running[req.id]
            self.settle(req, Outcome.TIMED_OUT, "client_timeout")
            self.policy.on_abort(self, req, pod)
            self.sync(pod)
            return
        self.policy.on_cancel(self, req)
        self.settle(req, Outcome.TIMED_OUT, "client_timeout")

    # ---- control plane -----------------------------------------------------------------
    def reconcile(self) -> None:
        self.pool.reconcile(self.now, self.desired, self.policy.warm_pool, self.policy.in_flight)
        for pod in self.pool.pods:
            if not pod.live and pod.running:
                self._kill(pod, "evicted")

    def _on_hpa(self, _: Any) -> None:
        new = self.policy.sized_replicas(self)
        if new is None:
            value, target, kind = self.policy.metric(self)
            current = self.policy.hpa_current(self)
            new = self.hpa.sync(self.now, value, target, kind, current) + self.policy.headroom
        if new != self.desired:
            self.actions.append(ScaleAction(self.now, self.desired, new))
            self.desired = new
            self.reconcile()
        self.schedule(self.now + self.scenario.scaling.polling_interval_seconds, "hpa")

    def _on_reconcile(self, _: Any) -> None:
        self.reconcile()
        self.schedule(self.now + RECONCILE_S, "reconcile")

    def _on_pod_ready(self, pod: Pod) -> None:
        self.pool.pod_ready(pod, self.now)
        self.reconcile()

    def _on_serving(self, pod: Pod) -> None:
        self.pool.start_serving(pod)

    def _on_tick(self, _: Any) -> None:
        self.policy.tick(self)
        self.schedule(self.now + TICK_S, "tick")

    def _on_sample(self, _: Any) -> None:
        for pod in self.pool.serving():
            self.sync(pod)
            pod.busy_samples.append(1 if pod.replica.num_running else 0)
        if int(self.now) % 15 == 0:
            self.timeline.append(
                {
                    "t": self.now,
                    "desired": self.desired,
                    "serving": len(self.pool.serving()),
                    "pods": sum(1 for _ in self.pool.live_pods()),
                    "warm": self.pool.count(constants.ROLE_WARM, ready=True),
                    "waiting": sum(p.replica.num_waiting for p in self.pool.serving()),
                }
            )
        self.schedule(self.now + SAMPLE_S, "sample")

    def _on_fault(self, fault: Any) -> None:
        serving = sorted(self.pool.serving(), key=lambda p: p.name)
        k = min(fault.count, len(serving))
        for ix in sorted(self.fault_rng.choice(len(serving), size=k, replace=False).tolist()):
            self._kill(serving[ix], "replica_lost")
        self.reconcile()

    def _kill(self, pod: Pod, reason: str) -> None:
        """``pod`` is gone: everything on it or queued in front of it is lost."""
        if pod.live:
            self.pool.delete(pod, self.now, lost=True)
        for req in list(pod.running.values()):
            self.settle(req, Outcome.LOST, reason)
        pod.running.clear()
        for req in self.policy.on_pod_lost(self, pod):
            if req.outcome is None:
                self.settle(req, Outcome.LOST, reason)
