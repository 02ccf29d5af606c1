"""The tidegate policy: the real admission engine in every pod, the real scaling law behind KEDA.

Adapter only; no decision logic of its own:

- each ready pod gets a :class:`tidegate.admission.engine.Engine` (``spec.admission``,
  ``spec.model``) whose clock is the simulator's virtual time, sized as the sidecar sizes it: an
  unset ``tokenBudget`` / ``maxConcurrency`` from the replica's KV capacity as the sim-backend
  publishes it (vLLM ``cache_config_info``), read through the sidecar's parser
  (:func:`reported_capacity`); requests reach it through the
  Service (round robin), with cost ``RequestCost.fixed(prompt, max_tokens)`` (an exact prompt
  count, as with ``tokenizer: backend``), streamed; the engine's ADMITTED / QUEUED / REJECTED
  answer, its settled queue and its releases drive the replica model, and each request's first
  token reaches :meth:`~tidegate.admission.engine.Engine.first_token` when the replica produces it
  (the proxy's first streamed event: batch composition, the breaker's TTFT). ``tick()`` every 0.1 s and telemetry
  (KV usage, generation counter) every ``telemetry.pollIntervalMs``, as the sidecar does;
- every KEDA poll builds the :class:`~tidegate.admission.stats.StatsSnapshot` of each pod in the
  Service (active, and warm ones with ``spec.warmPool.serve``: :class:`PodInfo` ``serving``) from
  its engine's counters and the budget in force (what the sidecar's stats endpoint serves), and runs the scaler's own
  pipeline: :class:`~tidegate.scaler.rates.SampleHistory` baselines ->
  :func:`tidegate.scaler.rates.observe` -> :func:`tidegate.scaler.law.decide` (``spec.scaling``),
  the same steps as ``tidegate.scaler.sidecar.SidecarSignals.observe`` without HTTP. The law's
  ``metric_value`` goes to the HPA as an ``AverageValue`` metric with target 1, under the HPA
  ``behavior`` the operator's own builder writes into the ScaledObject
  (:func:`tidegate.operator.builders.scaled_object.scaled_object`);
- the warm pool (``spec.warmPool.size``, ``serve``) is the operator's planner's (see :mod:`~.cluster`).
"""

from typing import Any

from tidegate.admission import telemetry
from tidegate.admission.breaker import Completion
from tidegate.admission.cost import RequestCost
from tidegate.admission.engine import BackendCapacity, Engine, Telemetry
from tidegate.admission.stats import StatsSnapshot, TenantCounters
from tidegate.admission.ticket import Ticket, TicketState
from tidegate.api.pool import InferencePool
from tidegate.api.serving import Engine as BackendEngine
from tidegate.operator import builders
from tidegate.operator.settings import OperatorSettings
from tidegate.scaler import law, rates
from tidegate.scaler.pods import PodInfo
from tidegate.sim.faults import FROZEN_GAUGES
from tidegate.sim.metrics import VllmMetrics
from tidegate.sim.replica import ReplicaConfig
from tidegate.sim.simulate.baselines import Policy
from tidegate.sim.simulate.cluster import Pod
from tidegate.sim.simulate.hpa import DEFAULT_BEHAVIOR, MetricType

STALE_AFTER_S = 30.0
"""The scaler's default ``stale_after_s`` (``tidegate.scaler.sidecar``)."""


class Tidegate(Policy):
    name = "tidegate"
    ticks = True

    def setup(self, sim: Any) -> None:
        super().setup(sim)
        sc = sim.scenario
        self.warm_pool = sc.warm_pool
        self.serve_warm = sc.warm_pool_serve
        self.law_policy = law.Policy.from_spec(sc.scaling)
        self.law_state = law.LawState()
        self.window_s = float(sc.scaling.signal.window_seconds)
        self.history = rates.SampleHistory(keep_s=2 * self.window_s, min_spacing_s=self.window_s / 8)
        self.req_of: dict[Ticket, Any] = {}
        self.decisions: list[law.Decision] = []
        self._telemetry_every = max(1, round(sc.admission.telemetry.poll_interval_ms / 100))
        self._ticks = 0

    def attach(self, sim: Any, pod: Pod) -> None:
        engine = pod.front = Engine(sim.scenario.admission, sim.scenario.model, clock=lambda: sim.now)
        engine.note_backend_healthy()
        engine.observe_telemetry(Telemetry(capacity=reported_capacity(sim.scenario.model.name, pod.replica.config)))

    # ---- requests ------------------------------------------------------------------------
    def on_arrival(self, sim: Any, req: Any) -> None:
        pod = self.route(sim, req)
        if isinstance(pod, str):
            sim.refuse(req, pod)
            return
        engine: Engine = pod.front
        ticket = engine.submit(
            req.tenant, req.priority, RequestCost.fixed(req.prompt_tokens, req.max_tokens, stream=True)
        )
        req.ticket, req.pod = ticket, pod
        if ticket.state is TicketState.ADMITTED:
            sim.start(req, pod)
        elif ticket.state is TicketState.QUEUED:
            self.req_of[ticket] = req
        else:
            sim.refuse(req, ticket.reason.value)
        self._settle(sim, pod)

    def _settle(self, sim: Any, pod: Pod, settled: list[Ticket] | None = None) -> None:
        """Start or refuse what left ``pod``'s admission queue (``settled``: already taken from it)."""
        tickets = (settled or []) + pod.front.take_settled()
        if not pod.live:
            return
        for ticket in tickets:
            req = self.req_of.pop(ticket, None)
            if req is None or req.outcome is not None:
                continue
            if ticket.state is TicketState.ADMITTED:
                sim.start(req, pod)
            else:
                sim.refuse(req, ticket.reason.value)

    def on_first_token(self, sim: Any, req: Any, pod: Pod) -> None:
        """The proxy's ``relay.on_first_event``: the engine learns the TTFT now (batch composition,
        the breaker), not when the generation ends."""
        backend_ttft_s = req.first_token_s - req.started_s  # as the proxy measures it: from forwarding
        pod.front.first_token(req.ticket, backend_ttft_s)
        self._settle(sim, pod)

    def on_finish(self, sim: Any, req: Any, pod: Pod) -> None:
        used = req.prompt_tokens + req.output_tokens
        backend_ttft_s = req.first_token_s - req.started_s  # as the proxy measures it: from forwarding
        pod.front.release(req.ticket, Completion.SUCCESS, ttft_s=backend_ttft_s, used_tokens=used)
        self._settle(sim, pod)

    def on_abort(self, sim: Any, req: Any, pod: Pod) -> None:
        pod.front.release(req.ticket, Completion.CANCELLED)
        self._settle(sim, pod)

    def on_cancel(self, sim: Any, req: Any) -> None:
        if req.ticket is not None and req.pod is not None and req.pod.front is not None:
            req.pod.front.cancel(req.ticket)
            self.req_of.pop(req.ticket, None)

    def on_pod_lost(self, sim: Any, pod: Pod) -> list[Any]:
        if pod.front is None:
            return []
        return [r for t in list(pod.front.queue.queued()) if (r := self.req_of.pop(t, None)) is not None]

    def in_flight(self, pod: Pod) -> int:
        return len(pod.running) + (pod.front.queue.depth if pod.front is not None else 0)

    def tick(self, sim: Any) -> None:
        self._ticks += 1
        telemetry = self._ticks % self._telemetry_every == 0
        for pod in sim.pool.live_pods():
            engine: Engine | None = pod.front
            if engine is None or not (engine.queue.depth or engine.in_flight or telemetry):
                continue
            if telemetry:
                sim.sync(pod)
                engine.observe_telemetry(
                    Telemetry(
                        kv_cache_usage=pod.replica.kv_usage,
                        generation_tokens_total=float(pod.replica.generation_tokens_total),
                        requests_running=pod.replica.reported_running,
                        requests_queued=pod.replica.reported_waiting,
                    )
                )
            self._settle(sim, pod, engine.tick())

    # ---- scaling -------------------------------------------------------------------------
    def hpa_behavior(self, scenario: Any) -> dict[str, Any]:
        """The HPA behaviour the operator writes into the pool's ScaledObject (the real builder)."""
        pool = InferencePool.model_validate(
            {
                "metadata": {"name": "sim", "namespace": "sim"},
                "spec": {
                    "model": scenario.model.model_dump(by_alias=True),
                    "server": {"image": "sim"},
                    "admission": scenario.admission.model_dump(by_alias=True),
                    "scaling": scenario.scaling.model_dump(by_alias=True),
                    "warmPool": {"size": scenario.warm_pool, "serve": scenario.warm_pool_serve},
                },
            }
        )
        manifest = builders.scaled_object(pool, OperatorSettings())
        return manifest["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]

    def metric(self, sim: Any) -> tuple[float, float, MetricType]:
        now = sim.now
        pods, current = [], {}
        for pod in sim.pool.live_pods():
            # the serving label as the operator writes it: every warm pod under spec.warmPool.serve
            info = PodInfo(name=pod.name, role=pod.role, ready=pod.ready, serving=self.serve_warm)
            pods.append(info)
            if (info.active or (info.in_service and info.ready)) and pod.front is not None:
                current[pod.name] = rates.Sample.of(snapshot(pod, now))  # what SidecarSignals polls
        baselines = {name: self.history.baseline(name, snap, self.window_s) for name, snap in current.items()}
        obs = rates.observe(
            pods,
            current,
            baselines,
            now,
            STALE_AFTER_S,
            max_window_s=2 * self.window_s,
            warm_pool_size=self.warm_pool,
            window_s=self.window_s,
        )
        for name, snap in current.items():
            self.history.record(name, snap)
        self.history.prune((p.name for p in pods), now)
        decision, self.law_state = law.decide(self.law_policy, obs, self.law_state, now)
        self.decisions.append(decision)
        return decision.metric_value, 1.0, MetricType.AVERAGE_VALUE


def reported_capacity(model_name: str, replica: ReplicaConfig) -> BackendCapacity | None:
    """The capacity a sidecar reads from this replica: the sim-backend's own ``/metrics`` page
    (vLLM's ``cache_config_info``), parsed by the sidecar's parser. A pod is Ready only once its
    sidecar knows it (``/tidegate/ready``), so the engine learns it before its first request."""
    page = VllmMetrics(model_name, replica.kv_capacity_tokens, lambda: dict.fromkeys(FROZEN_GAUGES, 0.0)).render()
    return telemetry.parse_backend_metrics(page.decode(), BackendEngine.VLLM).capacity


def snapshot(pod: Pod, now_s: float) -> StatsSnapshot:
    """What ``pod``'s sidecar would serve at ``/tidegate/stats`` now (its engine's counters and gauges)."""
    engine: Engine = pod.front
    c = engine.counters
    return StatsSnapshot(
        pod=pod.name,
        role=pod.role,
        instance_id=pod.name,
        started_at_s=pod.ready_at_s,
        time_s=now_s,
        admitted_total=c.admitted_total,
        admitted_demoted_total=c.admitted_demoted_total,
        admitted_tokens_total=c.admitted_tokens_total,
        completed_total=c.completed_total,
        rejected_total=dict(c.rejected_total),
        tenants={
            name: TenantCounters(
                admitted=t.admitted,
                admitted_tokens=t.admitted_tokens,
                demoted=t.demoted,
                capacity_rejected=t.capacity_rejected,
                policy_rejected=t.policy_rejected,
            )
            for name, t in c.tenants.items()
        },
        in_flight_requests=engine.in_flight_requests,
        in_flight_tokens=engine.in_flight_tokens,
        token_budget=engine.token_budget,  # in force: the adaptive budget over the engine's capacity
        max_concurrency=engine.admission.max_concurrency,
        token_budget_source=engine.sizing.budget_source.value,
        max_concurrency_source=engine.sizing.concurrency_source.value,
        queue_depth=engine.queue.depth,
        kv_cache_usage=min(1.0, pod.replica.kv_usage) if pod.replica is not None else None,
    )


class TidegateHpaWindow(Tidegate):
    """Tidegate with the HPA's *default* behaviour (300 s scale-down window, no pod-per-minute
    policy) instead of the operator's ScaledObject behaviour (60 s window, one pod a minute): shows
    what the scale-down policy is worth."""

    name = "tidegate-hpa300"

    def hpa_behavior(self, scenario: Any) -> dict[str, Any]:
        return DEFAULT_BEHAVIOR
