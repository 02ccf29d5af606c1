"""The admission engine: every decision, the queue and the accounting of one replica.

Decision order for :meth:`Engine.submit` (each step O(1) or O(classes), except the deadline
prediction which scans the bounded queue when it is not empty):

1. class and never-fits checks: unknown class -> ``bad_request``; cost over the replica's
   budget (less the shares reserved for other classes), over the tenant's whole bucket or over its
   ``maxInFlightTokens`` -> ``request_too_large`` (final, no ``retry_after_s``);
2. circuit breaker -> ``circuit_open``;
3. system gate (KV cache, GPU memory) -> ``kv_pressure`` / ``gpu_memory``; an expected gauge that
   never arrived counts as stale (``telemetry.onStale``, :mod:`~tidegate.admission.gate`);
4. tenant policy: accepted requests >= ``maxConcurrency``, or accepted tokens over
   ``maxInFlightTokens`` -> ``tenant_concurrency``; bucket short -> ``tenant_rate``. Policy state
   is per *account* (:mod:`~tidegate.admission.tenants`): under ``unlistedTenants: shared`` every
   unlisted name is one account, for these limits and for the fair queue's flows and weights alike;
   counters and metrics still name the tenant sent;
5. replica capacity: admit at once when nothing is queued and it fits; otherwise queue in the
   weighted-fair queue (:mod:`~tidegate.admission.fairqueue`) unless the predicted start misses
   the deadline (``slo_unreachable``, at once; the deadline, also the ``queue_timeout`` one, is the
   class TTFT SLO less the class's predicted backend TTFT,
   :meth:`~tidegate.admission.capacity.Capacity.predicted_ttft_s`, and at most ``queue.maxWaitMs``)
   or the queue is full (a higher class displaces the
   lowest queued request, else ``queue_full``; with queueing disabled ``token_budget`` or
   ``concurrency``). A tenant over ``borrowingCap`` x its fair share of the budget while other
   tenants are active is *demoted*: queued behind every normal request, admitted when room remains,
   promoted back as soon as it is within its share again. While the model server queues requests
   itself (``backendQueue``: vLLM waiting, llama.cpp deferred, TGI queue size; see
   :mod:`~tidegate.admission.gate`) nothing is admitted at once or dispatched: arrivals queue here,
   their predicted start includes the engine's queue draining through its running requests
   (:meth:`~tidegate.admission.capacity.Capacity.backend_wait_s`), and with queueing disabled they
   are refused with ``concurrency``.

:meth:`Engine.precheck` runs the refusals that need no body (circuit open, gate, tenant at its
concurrency cap or out of tokens) before the proxy reads and parses the body: the fast no. So a
tenant out of tokens gets ``tenant_rate`` even for a body that would be ``request_too_large``.

Every step that refuses after the breaker let a half-open probe through records that probe as
neutral, so the breaker's sample is never lost.

Priority classes rank by their order in ``priorityClasses`` (first = highest). Class ``c`` may use
the budget less the reserved shares of the other classes, used or not (tokens and concurrency
alike: headroom kept for them, :mod:`~tidegate.admission.capacity`).
Queued requests are offered in fair-queue order; one blocked by total capacity blocks everything
behind it (no starvation of large requests), one blocked only by another class's reservation lets
that class through.

Invariants (property-tested): reserved tokens in flight never exceed the token budget in force,
requests in flight never exceed the concurrency in force; every admitted ticket is released exactly once (a second
release raises :class:`~tidegate.admission.ticket.TicketStateError`); a ticket that leaves the
queue unserved gives back its tenant's tokens and concurrency; under backlog tenants are served in
proportion to their weights within the fair-queueing bound.

API (one replica): :meth:`Engine.submit` -> ticket ADMITTED / QUEUED / REJECTED (reason,
``retry_after_s``); :meth:`Engine.release` exactly once per admitted ticket; :meth:`Engine.cancel`
for a client gone while queued; :meth:`Engine.take_settled` for queued tickets that were admitted
or refused since (also by :meth:`Engine.dispatch`, :meth:`Engine.expire`, :meth:`Engine.tick`);
:meth:`Engine.observe_telemetry`, :meth:`Engine.note_progress`, :meth:`Engine.first_token`;
:attr:`Engine.counters` for the stats contract.

Sizing: ``tokenBudget`` and ``maxConcurrency`` unset (the default) come from the model server's
capacity as :meth:`Engine.observe_telemetry` delivers it; :attr:`Engine.sizing` says which numbers
are in force and where from, :attr:`Engine.configured` is the spec as given and :attr:`Engine.admission`
the same with those numbers filled in (:mod:`tidegate.admission.sizing`). The caller keeps a
replica out of service while :attr:`~tidegate.admission.sizing.Sizing.pending`. A capacity that
changes later (the server restarted with other flags) is put in force at once, logged as a
WARNING with the old and new numbers and counted in :attr:`Engine.sizing_changes`: requests
already admitted keep their reservations, and new ones wait until the held work fits the new
numbers. Numbers the spec sets never follow the server.

Capacity, the drain model behind every ``retry_after_s`` and deadline prediction, batch
composition (``maxPrefillTokens``), the adaptive budget and the shedding prediction live in
:mod:`tidegate.admission.capacity`.

Pure: the clock is injected, no I/O but the INFO log line of each breaker transition (standard
``logging``); the proxy, the simulator and the tests drive it.
"""

import heapq
import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from tidegate.admission import cost as costs
from tidegate.admission import sizing
from tidegate.admission.breaker import Breaker, BreakerState, Completion
from tidegate.admission.capacity import Capacity, EngineTuning
from tidegate.admission.fairqueue import FairQueue
from tidegate.admission.gate import GateSignal, QueueSignal
from tidegate.admission.reasons import CAPACITY_REASONS, Outcome, Reason
from tidegate.admission.sizing import BackendCapacity, Source
from tidegate.admission.tenants import TenantBook, TenantState, burst_tokens
from tidegate.admission.ticket import Ticket, TicketState, TicketStateError
from tidegate.api.admission import AdmissionSpec, PriorityClass
from tidegate.api.serving import Engine as BackendEngine
from tidegate.api.serving import ModelSpec


@dataclass(frozen=True, slots=True)
class Telemetry:
    """One reading of the backend and the GPU (``None``: not available)."""

    kv_cache_usage: float | None = None  # 0..1
    gpu_memory_usage: float | None = None  # used / total, 0..1
    generation_tokens_total: float | None = None  # monotonic counter: token progress
    requests_running: int | None = None  # being generated by the model server now
    requests_queued: int | None = None  # waiting in the model server's own queue (gate.QueueSignal)
    capacity: BackendCapacity | None = None


@dataclass(slots=True)
class TenantCounts:
    """Monotonic per-tenant counters (the stats contract's ``TenantCounters``)."""

    admitted: int = 0
    admitted_tokens: int = 0
    demoted: int = 0
    capacity_rejected: int = 0
    policy_rejected: int = 0


@dataclass(slots=True)
class Counters:
    """Monotonic counters since the engine was created."""

    admitted_total: int = 0
    admitted_demoted_total: int = 0
    admitted_tokens_total: int = 0
    completed_total: int = 0
    cancelled_total: int = 0
    displaced_total: int = 0
    charged_tokens_total: int = 0
    usage_missing_total: int = 0
    shed_total: int = 0
    rejected_total: Counter[Reason] = field(default_factory=Counter)
    tenants: dict[str, TenantCounts] = field(default_factory=dict)


KV_GAUGE_ENGINES = frozenset({BackendEngine.VLLM})
"""Engines whose metrics carry a KV-cache usage gauge (:mod:`tidegate.admission.telemetry`)."""
QUEUE_GAUGE_ENGINES = frozenset({BackendEngine.VLLM, BackendEngine.LLAMACPP, BackendEngine.TGI})
"""Engines whose metrics report requests waiting in their own queue."""
log = logging.getLogger(__name__)


def _log_breaker(old: BreakerState, new: BreakerState, reason: str) -> None:
    """Every trip, half-open and close of the breaker, at INFO with its reason."""
    log.info("circuit breaker %s -> %s: %s", old.value, new.value, reason)


MAX_COUNTED_TENANTS = 100_000
"""Tenants counted by name in :attr:`Engine.counters`; later ones are counted as ``other``."""
_NO_COST = costs.RequestCost(0, 0, 1)  # the cost of a ticket refused before its body was read


class Engine:
    """Admission for one replica; see the module docstring. Times are seconds from ``clock``."""

    def __init__(
        self,
        admission: AdmissionSpec,
        model: ModelSpec,
        clock: Callable[[], float],
        tuning: EngineTuning | None = None,
    ) -> None:
        self.clock = clock
        self.tuning = tuning or EngineTuning()
        self.counters = Counters()
        self.queue = FairQueue()
        self.kv = GateSignal()
        self.gpu = GateSignal()
        self.backend_queue = QueueSignal()
        self.backend_running: int | None = None
        self.backend_capacity: BackendCapacity | None = None
        self._capacity_wait_from_s: float | None = None  # when the model server first answered healthy
        self.model = model
        self.sizing = sizing.size(admission, model, None, waited_out=False)
        self._announced: sizing.Sizing | None = None  # the sizing last logged by reconfigure
        self.sizing_changes = 0  # times a known budget or concurrency changed with the server's capacity
        self.capacity = Capacity(self._effective(admission), self.tuning, clock())
        self._deadlines: list[tuple[float, int, Ticket]] = []
        self._settled: list[Ticket] = []
        self._next_id = 0
        self._last_progress_s = clock()
        self._last_generation_total: float | None = None
        self._compacted_at_s = clock()
        self._active_weight = 0.0
        self.breaker = Breaker(admission.circuit_breaker, self.tuning.breaker, clock, on_transition=_log_breaker)
        self.tenants = TenantBook(admission.tenancy)
        self.reconfigure(admission, model)

    # ---- configuration -------------------------------------------------------------------

    def reconfigure(self, admission: AdmissionSpec, model: ModelSpec) -> None:
        """Apply new settings; in-flight and queued requests are kept (nothing is dropped).

        :attr:`configured` is ``admission`` as given; :attr:`admission` is the same with the token
        budget and concurrency in force filled in (:attr:`sizing`, :mod:`tidegate.admission.sizing`)."""
        if model.engine is not self.model.engine:  # another server: what the old one reported means nothing
            self.backend_capacity, self._capacity_wait_from_s = None, None
        self.configured, self.model = admission, model
        now = self.clock()  # the signals this engine serves are expected from now (gate module table)
        if model.engine not in KV_GAUGE_ENGINES and self.kv.expected_since_s is not None:
            self.kv = GateSignal()  # another engine now: the old one's last reading means nothing
        if model.engine not in QUEUE_GAUGE_ENGINES and self.backend_queue.expected_since_s is not None:
            self.backend_queue = QueueSignal()
        self.kv.expect(now if model.engine in KV_GAUGE_ENGINES else None)
        self.backend_queue.expect(now if model.engine in QUEUE_GAUGE_ENGINES else None)
        self._classes: dict[str, tuple[int, PriorityClass]] = {
            c.name: (rank, c) for rank, c in enumerate(admission.priority_classes)
        }
        old, self.sizing = (
            self._announced,
            sizing.size(admission, model, self.backend_capacity, waited_out=self._waited_out(now)),
        )
        self._apply_sizing()
        self._announce(old)
        self.breaker.reconfigure(admission.circuit_breaker)
        self.breaker.slo_floor_s = min(c.ttft_slo_ms for c in admission.priority_classes) / 1000.0
        self.tenants.reconfigure(admission.tenancy)
        self._active_weight = sum(s.policy.weight for s in self.tenants.states.values() if s.accepted)

    def _effective(self, admission: AdmissionSpec) -> AdmissionSpec:
        return admission.model_copy(
            update={"token_budget": self.sizing.token_budget, "max_concurrency": self.sizing.max_concurrency}
        )

    def _apply_sizing(self) -> None:
        """Put :attr:`sizing` in force (the adaptive budget restarts from a new base)."""
        self.admission = admission = self._effective(self.configured)
        self.capacity.configure(admission, self._classes)
        budget = self.sizing.token_budget
        # tokens a class may ever hold (base budget): the budget less the other classes' reservations
        self._room = {c.name: budget - self.capacity.others_share(c.name) * budget for c in admission.priority_classes}

    def _waited_out(self, now: float) -> bool:
        start = self._capacity_wait_from_s
        return start is not None and now - start >= self.tuning.capacity_wait_s

    def _resize(self) -> None:
        """Size again from what is known now; a change is logged and put in force."""
        new = sizing.size(self.configured, self.model, self.backend_capacity, waited_out=self._waited_out(self.clock()))
        if new == self.sizing:
            return
        old, self.sizing = self.sizing, new
        self._apply_sizing()
        numbers = (old.token_budget, old.max_concurrency), (new.token_budget, new.max_concurrency)
        if old.pending or new.pending or numbers[0] == numbers[1]:
            self._announce(old)
        else:  # a server restarted with another shape: loud, whichever way it went
            self._announced = new
            self.sizing_changes += 1
            log.warning(
                "admission sizing changed with the model server's capacity: token budget %d -> %d (%s), "
                "max concurrency %d -> %d (%s); %d requests in flight keep their reservations",
                old.token_budget, new.token_budget, new.budget_source.value, old.max_concurrency,
                new.max_concurrency, new.concurrency_source.value, self.in_flight_requests,
            )  # fmt: skip
        self.dispatch()

    def _announce(self, old: sizing.Sizing | None) -> None:
        """Log a new sizing: a fallback once as a WARNING, numbers read from the engine at INFO."""
        new, engine = self.sizing, self.model.engine
        self._announced = new
        fallback = sizing.describe(new, engine)
        if fallback is not None:
            if old is None or sizing.describe(old, engine) != fallback:
                log.warning("admission sizing: %s", fallback)
        elif (
            not new.pending
            and (
                old is None
                or old.pending
                or (old.token_budget, old.max_concurrency) != (new.token_budget, new.max_concurrency)
            )
            and Source.ENGINE in (new.budget_source, new.concurrency_source)
        ):
            log.info(
                "admission sizing: token budget %d (%s), max concurrency %d (%s)",
                new.token_budget, new.budget_source.value, new.max_concurrency, new.concurrency_source.value,
            )  # fmt: skip

    def note_backend_healthy(self) -> None:
        """The model server answered its health check: the bounded wait for its capacity starts
        (:attr:`EngineTuning.capacity_wait_s`; a model still loading does not use it up)."""
        if self._capacity_wait_from_s is None:
            self._capacity_wait_from_s = self.clock()
            self._resize()

    def cost(self, path: str, body: object, prompt_tokens: int | None = None) -> costs.RequestCost:
        """The cost of an OpenAI body under this engine's model settings (raises ``CostError``)."""
        return costs.of_body(
            path,
            body,
            max_context_tokens=self.model.max_context_tokens,
            default_max_tokens=self.model.default_max_tokens,
            chars_per_token=self.model.estimate_chars_per_token,
            safety_factor=self.admission.safety_factor,
            prompt_tokens=prompt_tokens,
        )

    # ---- gauges -------------------------------------------------------------------------

    @property
    def in_flight(self) -> dict[int, Ticket]:
        """Admitted tickets not yet released, by id."""
        return self.capacity.in_flight

    @property
    def in_flight_requests(self) -> int:
        """Admitted requests not yet released."""
        return len(self.capacity.in_flight)

    @property
    def in_flight_tokens(self) -> int:
        """Reserved tokens of the admitted requests."""
        return self.capacity.tokens

    @property
    def token_budget(self) -> int:
        """The token budget in force (``tokenBudget``, or the adaptive budget's current value)."""
        return self.capacity.token_budget

    @property
    def prefilling_tokens(self) -> int:
        """Prompt tokens of admitted requests whose first token has not been seen."""
        return self.capacity.prefilling_tokens

    @property
    def backend_queue_held(self) -> bool:
        """Whether new work is held back now because the model server queues requests itself."""
        return self._held(self.clock())

    @property
    def breaker_state(self) -> BreakerState:
        """The circuit breaker's state now."""
        return self.breaker.state

    @property
    def mean_duration_s(self) -> float:
        """Mean duration of recent successful requests (the drain model's ``d``)."""
        return self.capacity.mean_duration_s

    def take_settled(self) -> list[Ticket]:
        """Queued tickets that left the queue (admitted or refused) since the last call."""
        settled, self._settled = self._settled, []
        return settled

    # ---- decisions ----------------------------------------------------------------------

    def refuse(
        self, tenant: str, priority: str | None, reason: Reason, message: str, code: str | None = None
    ) -> Ticket:
        """Record a refusal decided before :meth:`submit` (bad body, unknown key, not active)."""
        ticket = self._new_ticket(tenant, priority or self.admission.default_priority_class, _NO_COST)
        return self._reject(ticket, reason, message, None, code=code)

    def precheck(self, tenant: str, priority: str | None) -> Ticket | None:
        """The refusals that need no request body (the fast no), or None to go on to :meth:`submit`.

        Checked before the body is read and parsed, so a flood of refused requests costs little:
        circuit open, system gate, the tenant at its concurrency cap, or its bucket empty (retry
        when it holds its last request's cost again). A REJECTED ticket comes back, counted."""
        now = self.clock()
        if self.breaker.spec.enabled and self.breaker.state is BreakerState.OPEN:
            ticket = self._new_ticket(tenant, priority or self.admission.default_priority_class, _NO_COST)
            return self._reject(ticket, Reason.CIRCUIT_OPEN, "the model server is degraded; circuit open",
                                self.breaker.retry_after_s() or 1.0)  # fmt: skip
        gate = self._gate_reason(now)
        if gate is not None:
            ticket = self._new_ticket(tenant, priority or self.admission.default_priority_class, _NO_COST)
            return self._reject(ticket, gate, f"backend under {gate.value.replace('_', ' ')}", self._gate_wait_s())
        account = self.tenants.account(tenant)
        state = self.tenants.states.get(account)
        if state is None:
            return None
        policy, who = state.policy, self.tenants.describe(account, tenant)
        if policy.max_concurrency is not None and state.accepted >= policy.max_concurrency:
            ticket = self._new_ticket(tenant, priority or self.admission.default_priority_class, _NO_COST)
            return self._reject(
                ticket, Reason.TENANT_CONCURRENCY,
                f"{who} has {state.accepted} requests in progress (limit {policy.max_concurrency})",
                self.capacity.mean_duration_s / 2,
            )  # fmt: skip
        if policy.tokens_per_second is not None and state.rate_wait_s(1, now) > 0:
            ticket = self._new_ticket(tenant, priority or self.admission.default_priority_class, _NO_COST)
            return self._reject(
                ticket, Reason.TENANT_RATE, f"{who} is over {policy.tokens_per_second:g} tokens/s",
                state.rate_wait_s(state.last_cost, now),
            )  # fmt: skip
        return None

    def submit(self, tenant: str, priority: str | None, cost: costs.RequestCost) -> Ticket:
        """Decide on one request: the ticket comes back ADMITTED, QUEUED or REJECTED."""
        now = self.clock()
        name = priority or self.admission.default_priority_class
        ticket = self._new_ticket(tenant, name, cost)
        if name not in self._classes:
            known = ", ".join(self._classes)
            return self._reject(ticket, Reason.BAD_REQUEST, f"unknown priority class {name!r} (known: {known})", None)
        rank, klass = self._classes[name]
        ticket.rank = rank
        # The SLO is on the TTFT the client sees: the queue wait plus the backend's own TTFT.
        backend_ttft = self.capacity.predicted_ttft_s(name)
        slo_wait = klass.ttft_slo_ms / 1000.0 - backend_ttft
        ticket.deadline_s = now + max(0.0, min(slo_wait, self.admission.queue.max_wait_ms / 1000.0))
        budget = self.admission.token_budget
        room = self._room[name]
        account = ticket.account
        policy, who = self.tenants.policy(account), self.tenants.describe(account, tenant)
        if cost.reserved_tokens > room:
            return self._reject(
                ticket, Reason.REQUEST_TOO_LARGE,
                f"request needs {cost.reserved_tokens} tokens; class {name!r} may use at most {math.floor(room)} "
                f"of this replica's {budget}-token budget", None, code="request_too_large",
            )  # fmt: skip
        if policy.max_in_flight_tokens is not None and cost.reserved_tokens > policy.max_in_flight_tokens:
            return self._reject(
                ticket, Reason.REQUEST_TOO_LARGE,
                f"request needs {cost.reserved_tokens} tokens; {who} may hold at most "
                f"{policy.max_in_flight_tokens} in flight", None, code="request_too_large",
            )  # fmt: skip
        if cost.reserved_tokens > burst_tokens(policy):
            return self._reject(
                ticket, Reason.REQUEST_TOO_LARGE,
                f"request needs {cost.reserved_tokens} tokens; {who} may use at most "
                f"{burst_tokens(policy):.0f} per window", None, code="request_too_large",
            )  # fmt: skip

        allowed, ticket.probe_epoch = self.breaker.allow()
        if not allowed:
            return self._reject(
                ticket, Reason.CIRCUIT_OPEN, "the model server is degraded; circuit open",
                self.breaker.retry_after_s() or 1.0,
            )  # fmt: skip
        gate = self._gate_reason(now)
        if gate is not None:
            return self._reject(ticket, gate, f"backend under {gate.value.replace('_', ' ')}", self._gate_wait_s())

        state = self.tenants.state(account, now)
        if policy.max_concurrency is not None and state.accepted >= policy.max_concurrency:
            return self._reject(
                ticket, Reason.TENANT_CONCURRENCY,
                f"{who} has {state.accepted} requests in progress (limit {policy.max_concurrency})",
                self.capacity.mean_duration_s / 2,
            )  # fmt: skip
        cap = policy.max_in_flight_tokens
        if cap is not None and state.accepted_tokens + cost.reserved_tokens > cap:
            return self._reject(
                ticket, Reason.TENANT_CONCURRENCY,
                f"{who} holds {state.accepted_tokens} tokens queued or in flight (limit {cap})",
                self.capacity.mean_duration_s / 2,
            )  # fmt: skip
        rate_wait = state.rate_wait_s(cost.reserved_tokens, now)
        if rate_wait > 0:
            return self._reject(
                ticket, Reason.TENANT_RATE,
                f"{who} is over {policy.tokens_per_second:g} tokens/s", rate_wait,
            )  # fmt: skip

        weight = policy.weight * klass.weight
        if self._over_fair_share(account, state.running_tokens + cost.reserved_tokens, policy.weight):
            ticket.outcome = Outcome.ADMIT_DEMOTED
        else:
            ticket.outcome = Outcome.ADMIT
        if self.queue.depth == 0 and not ticket.demoted and self.capacity.fits(ticket)[0] and not self._held(now):
            self._accept(ticket, state, now)
            self.queue.tag(ticket, weight)
            self.queue.served(ticket)
            self._admit(ticket, now)
            return ticket
        return self._enqueue(ticket, state, weight, now)

    def _enqueue(self, ticket: Ticket, state: TenantState, weight: float, now: float) -> Ticket:
        max_depth = self.admission.queue.max_depth
        held = self._held(now)
        if max_depth == 0:
            if ticket.demoted and self.capacity.fits(ticket)[0] and not held:
                self._accept(ticket, state, now)
                self.queue.tag(ticket, weight)
                self.queue.served(ticket)
                self._admit(ticket, now)
                return ticket
            if held:  # the model server's own queue is its concurrency limit speaking
                return self._reject(ticket, Reason.CONCURRENCY, self._held_message(), self._wait_s(ticket, 0, 0, held))
            reason = Reason.CONCURRENCY if self.capacity.lacks_concurrency(ticket) else Reason.TOKEN_BUDGET
            return self._reject(ticket, reason, "replica at capacity", self.capacity.wait_s(ticket, 0, 0))
        finish = self.queue.peek_finish(ticket.account, ticket.priority, ticket.reserved_tokens, weight)
        ahead_tokens, ahead_requests = self.queue.ahead_of(ticket.demoted, finish)
        wait = self._wait_s(ticket, ahead_tokens, ahead_requests, held)
        if now + wait > ticket.deadline_s:
            backend_ttft = self.capacity.predicted_ttft_s(ticket.priority)
            return self._reject(
                ticket, Reason.SLO_UNREACHABLE,
                f"predicted start in {wait:.2f} s misses the {ticket.priority!r} deadline"
                + (f" (its TTFT SLO less {backend_ttft:.2f} s of backend TTFT)" if backend_ttft else ""), wait,
            )  # fmt: skip
        if self.queue.depth >= max_depth:
            victim = self.queue.lowest_priority()
            if victim is None or victim.rank <= ticket.rank:
                return self._reject(
                    ticket,
                    Reason.QUEUE_FULL,
                    "admission queue full",
                    self._wait_s(ticket, *self._queue_totals(), held),
                )
            self._leave_queue(victim)
            self.counters.displaced_total += 1
            self._reject(
                victim,
                Reason.QUEUE_FULL,
                "displaced by a higher-priority request",
                self._wait_s(victim, *self._queue_totals(), held),
            )
            self._settled.append(victim)
        self._accept(ticket, state, now)
        self.queue.tag(ticket, weight)
        ticket.state = TicketState.QUEUED
        self.queue.push(ticket)
        heapq.heappush(self._deadlines, (ticket.deadline_s, ticket.id, ticket))
        admitted = self.dispatch()
        if ticket in admitted:
            self._settled.remove(ticket)  # the caller sees it admitted directly
        return ticket

    def release(
        self,
        ticket: Ticket,
        completion: Completion,
        *,
        ttft_s: float | None = None,
        used_tokens: int | None = None,
        usage_reported: bool | None = None,
    ) -> None:
        """End an admitted request. ``used_tokens``: prompt + output tokens, as the backend
        reported them (``usage_reported``, default: whether ``used_tokens`` is given) or as the
        proxy counted them; ``None`` or 0 charges the reservation, never zero. Raises
        :class:`TicketStateError` unless the ticket is ADMITTED (so a double release is caught)."""
        if ticket.state is not TicketState.ADMITTED or not self.capacity.free(ticket):
            raise TicketStateError(f"ticket {ticket.id} is {ticket.state.value}, not admitted: cannot release")
        now = self.clock()
        ticket.state, ticket.released_at_s = TicketState.RELEASED, now
        charged = used_tokens if used_tokens is not None and used_tokens > 0 else ticket.reserved_tokens
        # A backend's usage is not trusted blindly: an absurd count would overflow the tenant's
        # bucket (and leak its concurrency slot). No real response uses more than the context
        # window per sequence; 4x the larger of that and the reservation is a generous bound.
        charged = min(charged, 4 * max(ticket.reserved_tokens, self.model.max_context_tokens))
        if not (used_tokens is not None if usage_reported is None else usage_reported):
            self.counters.usage_missing_total += 1
        ticket.charged_tokens = charged
        self.counters.completed_total += 1
        self.counters.charged_tokens_total += charged
        state = self.tenants.state(ticket.account, now)
        state.running_tokens -= ticket.reserved_tokens
        state.give_back(ticket.reserved_tokens - charged, now)
        self._unaccept(ticket, state)
        self.breaker.record(
            completion, None if ticket.ttft_judged else ttft_s, ticket.probe_epoch, tenant=ticket.tenant,
            work_tokens=ticket.prefill_work_tokens,
        )  # fmt: skip
        if completion is Completion.SUCCESS:
            self._last_progress_s = now
            started = ticket.admitted_at_s if ticket.admitted_at_s is not None else now
            self.capacity.learn(ticket, now - started, charged, ttft_s)
        else:
            self.capacity.learn_ttft(ticket, ttft_s)
        self.dispatch()

    def cancel(self, ticket: Ticket) -> bool:
        """The client of a QUEUED ticket went away: drop it (never dispatched). False if not queued."""
        if ticket.state is not TicketState.QUEUED:
            return False
        self._leave_queue(ticket)
        ticket.state = TicketState.CANCELLED
        self.counters.cancelled_total += 1
        self.dispatch()
        return True

    def dispatch(self) -> list[Ticket]:
        """Admit queued requests that fit now, in fair-queue order; returns them."""
        admitted: list[Ticket] = []
        now = self.clock()
        if self.queue.depth == 0 or self._gate_reason(now) is not None or self._held(now):
            return admitted
        progress = True
        while progress and self.queue.depth:
            progress = False
            for ticket in self.queue.candidates(self._still_demoted):
                fits, blocked_by_total = self.capacity.fits(ticket)
                if fits:
                    self.queue.pop(ticket)
                    self._admit(ticket, now)
                    admitted.append(ticket)
                    self._settled.append(ticket)
                    progress = True
                    break
                if blocked_by_total:
                    break
        return admitted

    def expire(self) -> list[Ticket]:
        """Refuse queued requests past their deadline (``queue_timeout``); returns them."""
        now = self.clock()
        expired: list[Ticket] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, ticket = heapq.heappop(self._deadlines)
            if ticket.state is TicketState.QUEUED:
                self._leave_queue(ticket)
                self._reject(ticket, Reason.QUEUE_TIMEOUT, "waited too long in the admission queue",
                             self._wait_s(ticket, *self._queue_totals(), self._held(now)))  # fmt: skip
                self._settled.append(ticket)
                expired.append(ticket)
        return expired

    def tick(self) -> list[Ticket]:
        """Periodic upkeep (call every ~50-100 ms): expiry, stall check, breaker, dispatch,
        forgetting idle tenants. Returns the tickets settled since the last call."""
        now = self.clock()
        if self.sizing.pending:
            self._resize()  # the bounded wait for the model server's capacity may be over
        self.expire()
        self._check_stall()
        if self.breaker.state is BreakerState.OPEN and self.queue.depth:
            for ticket in list(self.queue.queued()):
                self._leave_queue(ticket)
                self._reject(ticket, Reason.CIRCUIT_OPEN, "the model server is degraded; circuit open",
                             self.breaker.retry_after_s() or 1.0)  # fmt: skip
                self._settled.append(ticket)
        self.capacity.adapt(now)
        self.capacity.end_estimated_prefills(now)
        self.dispatch()
        if now - self._compacted_at_s >= self.tuning.compact_every_s:
            self._compacted_at_s = now
            self.tenants.prune(now, self.tuning.forget_tenant_after_s)
            self.queue.compact()
        return self.take_settled()

    def first_token(self, ticket: Ticket, ttft_s: float | None = None) -> None:
        """The backend produced ``ticket``'s first token ``ttft_s`` after it was forwarded: its
        prefill is over (batch composition), and the breaker judges that TTFT now, not when the
        request ends (:meth:`~tidegate.admission.breaker.Breaker.first_token`; :meth:`release`
        then gives it the outcome alone). Once per ticket; later calls change nothing."""
        if ticket.state is TicketState.ADMITTED and ttft_s is not None and not ticket.ttft_judged:
            ticket.ttft_judged = True
            if self.breaker.first_token(ttft_s, ticket.probe_epoch, work_tokens=ticket.prefill_work_tokens):
                ticket.probe_epoch = None  # a failed probe already: its end counts as an ordinary request
        if self.capacity.first_token(ticket, ttft_s):
            self.dispatch()

    def predicted_duration_s(self, ticket: Ticket) -> float:
        """How long ``ticket`` should run (drain model; see :mod:`tidegate.admission.capacity`)."""
        return self.capacity.predicted_duration_s(ticket)

    def overdue(self) -> list[Ticket]:
        """In-flight requests running past ``shedAfterMultiple`` x their prediction (off: [])."""
        return self.capacity.overdue(self.clock())

    def note_shed(self, ticket: Ticket) -> None:
        """The proxy aborted ``ticket`` (one of :meth:`overdue`) to shed it; call once per ticket.
        Counted in ``counters.shed_total``; the ticket is still released as usual (neutral outcome)."""
        if ticket.state is TicketState.ADMITTED:
            self.counters.shed_total += 1

    def _check_stall(self) -> None:
        """Trip the breaker on no token progress while requests are in flight. Progress is seen
        through the backend's token counter when it has one (vLLM, llama.cpp); otherwise only
        streamed requests can show it, so long non-streamed requests never count as a stall."""
        if self._last_generation_total is not None:
            watched, since = self.in_flight_requests, self.capacity.busy_since_s
        else:
            streams = [t.admitted_at_s or 0.0 for t in self.in_flight.values() if t.cost.stream]
            watched, since = len(streams), min(streams, default=0.0)
        self.breaker.check_stall(
            watched, max(self._last_progress_s, since), float(self.admission.request_timeout_seconds)
        )

    def note_progress(self) -> None:
        """The backend produced tokens (a streamed chunk, a response): it is not stalled."""
        self._last_progress_s = self.clock()

    def observe_telemetry(self, reading: Telemetry) -> None:
        """A fresh reading of the backend metrics and/or NVML."""
        now = self.clock()
        if reading.kv_cache_usage is not None:
            self.kv.observe(reading.kv_cache_usage, now, self.admission.kv_cache)
        if reading.gpu_memory_usage is not None:
            self.gpu.observe(reading.gpu_memory_usage, now, self.admission.gpu_memory)
        if reading.requests_queued is not None:
            self.backend_queue.observe(reading.requests_queued, now)
        if reading.requests_running is not None:
            self.backend_running = reading.requests_running
        if reading.capacity is not None and reading.capacity != self.backend_capacity:
            self.backend_capacity = reading.capacity
            self._resize()
        total = reading.generation_tokens_total
        if total is not None:
            if self._last_generation_total is not None and total > self._last_generation_total:
                self._last_progress_s = now
            self._last_generation_total = total
        self.dispatch()

    # ---- internals ----------------------------------------------------------------------

    def _new_ticket(self, tenant: str, priority: str, cost: costs.RequestCost) -> Ticket:
        self._next_id += 1
        return Ticket(
            id=self._next_id, tenant=tenant, priority=priority, cost=cost, submitted_at_s=self.clock(),
            account=self.tenants.account(tenant),
        )  # fmt: skip

    def _tenant_counts(self, tenant: str) -> TenantCounts:
        counts = self.counters.tenants.get(tenant)
        if counts is None:
            if len(self.counters.tenants) >= MAX_COUNTED_TENANTS:  # bounded memory; stays monotonic
                tenant = "other"
                counts = self.counters.tenants.get(tenant)
            if counts is None:
                counts = self.counters.tenants[tenant] = TenantCounts()
        return counts

    def _reject(
        self, ticket: Ticket, reason: Reason, message: str, retry_after_s: float | None, code: str | None = None
    ) -> Ticket:
        ticket.state, ticket.outcome = TicketState.REJECTED, Outcome.REJECT
        ticket.reason, ticket.message, ticket.code = reason, message, code
        ticket.retry_after_s = None if retry_after_s is None else max(0.0, retry_after_s)
        if ticket.probe_epoch is not None:  # a probe refused later in the pipeline frees its slot
            self.breaker.record(Completion.NEUTRAL, None, ticket.probe_epoch)
            ticket.probe_epoch = None
        self.counters.rejected_total[reason] += 1
        counts = self._tenant_counts(ticket.tenant)
        if reason in CAPACITY_REASONS:
            counts.capacity_rejected += 1
        else:
            counts.policy_rejected += 1
        return ticket

    def _accept(self, ticket: Ticket, state: TenantState, now: float) -> None:
        """Take the tenant's concurrency slot and tokens (held until release or leaving the queue)."""
        if state.accepted == 0:
            self._active_weight += state.policy.weight
        state.accepted += 1
        state.accepted_tokens += ticket.reserved_tokens
        state.last_cost = ticket.reserved_tokens
        state.take(ticket.reserved_tokens, now)

    def _unaccept(self, ticket: Ticket, state: TenantState) -> None:
        state.accepted -= 1
        state.accepted_tokens -= ticket.reserved_tokens
        if state.accepted == 0:
            self._active_weight = max(0.0, self._active_weight - state.policy.weight)

    def _leave_queue(self, ticket: Ticket) -> None:
        """A queued ticket leaves unserved: give back its tenant's slot and tokens."""
        now = self.clock()
        self.queue.left(ticket, served=False)
        state = self.tenants.state(ticket.account, now)
        state.give_back(ticket.reserved_tokens, now)
        self._unaccept(ticket, state)
        if ticket.probe_epoch is not None:
            self.breaker.record(Completion.CANCELLED, None, ticket.probe_epoch)
            ticket.probe_epoch = None

    def _admit(self, ticket: Ticket, now: float) -> None:
        ticket.state, ticket.admitted_at_s = TicketState.ADMITTED, now
        self.capacity.hold(ticket, now)
        ticket.prefill_work_tokens = self.capacity.prefilling_tokens  # what its TTFT waits for (breaker)
        self.tenants.state(ticket.account, now).running_tokens += ticket.reserved_tokens
        self.counters.admitted_total += 1
        self.counters.admitted_tokens_total += ticket.reserved_tokens
        counts = self._tenant_counts(ticket.tenant)
        counts.admitted += 1
        counts.admitted_tokens += ticket.reserved_tokens
        if ticket.demoted:
            self.counters.admitted_demoted_total += 1
            counts.demoted += 1

    def _over_fair_share(self, account: str, tokens: int, weight: float) -> bool:
        """Would ``tokens`` accepted put the account over ``borrowingCap`` x its fair share?"""
        state = self.tenants.states.get(account)
        active = self._active_weight + (0.0 if state is not None and state.accepted else weight)
        if active <= weight + 1e-9:
            return False  # alone: all idle capacity is its to borrow
        share = self.token_budget * weight / active
        return tokens > self.admission.tenancy.borrowing_cap * share

    def _still_demoted(self, ticket: Ticket) -> bool:
        state = self.tenants.states.get(ticket.account)
        running = state.running_tokens if state is not None else 0
        return self._over_fair_share(
            ticket.account, running + ticket.reserved_tokens, self.tenants.policy(ticket.account).weight
        )

    def _queue_totals(self) -> tuple[int, int]:
        return self.queue.tokens, self.queue.depth

    def _gate_reason(self, now: float) -> Reason | None:
        if self.kv.value is None and self.gpu.value is None and self.kv.expected_since_s is None:
            return None  # no telemetry at all (engine without a KV gauge, no GPU): nothing to gate on
        telemetry = self.admission.telemetry
        idle = not self.in_flight
        if self.kv.blocking(
            now, self.admission.kv_cache, stale_after_s=telemetry.stale_after_seconds, on_stale=telemetry.on_stale,
            idle=idle, frozen_after_s=self.tuning.frozen_after_s,
        ):  # fmt: skip
            return Reason.KV_PRESSURE
        if self.gpu.blocking(
            now, self.admission.gpu_memory, stale_after_s=telemetry.stale_after_seconds, on_stale=telemetry.on_stale
        ):
            return Reason.GPU_MEMORY
        return None

    def _held(self, now: float) -> bool:
        """Whether new work is held back from the model server because its own queue is full
        (``backendQueue``; the stale and frozen rules of :mod:`tidegate.admission.gate`)."""
        spec, telemetry = self.admission.backend_queue, self.admission.telemetry
        return spec.enabled and self.backend_queue.holding(
            now, max_queued=spec.max_queued, stale_after_s=telemetry.stale_after_seconds,
            on_stale=telemetry.on_stale, idle=not self.in_flight, frozen_after_s=self.tuning.frozen_after_s,
        )  # fmt: skip

    def _held_message(self) -> str:
        queued = self.backend_queue.value
        if queued is None or queued <= self.admission.backend_queue.max_queued:
            return "the model server's queue length is unknown (stale telemetry, onStale failClosed)"
        return f"the model server has {queued} requests waiting in its own queue"

    def _wait_s(self, ticket: Ticket, ahead_tokens: int, ahead_requests: int, held: bool) -> float:
        """Predicted wait behind this queue (drain model), and while new work is held, behind the
        model server's own queue too (:meth:`Capacity.backend_wait_s`)."""
        wait = self.capacity.wait_s(ticket, ahead_tokens, ahead_requests)
        if not held:
            return wait
        queued = max(0, (self.backend_queue.value or 0) - self.admission.backend_queue.max_queued)
        running = self.backend_running or self.in_flight_requests
        return max(wait, self.capacity.backend_wait_s(queued + ahead_requests + 1, running))

    def telemetry_age_s(self) -> float | None:
        """Seconds since the oldest of the backend's load signals was last read (KV gauge, queue),
        None if none was ever read: what ``telemetry.staleAfterSeconds`` is compared against."""
        now = self.clock()
        ages = [age for age in (self.kv.age_s(now), self.backend_queue.age_s(now)) if age is not None]
        return max(ages) if ages else None

    def _gate_wait_s(self) -> float:
        """Time for in-flight work to bring KV usage under ``resume`` (drain model)."""
        usage, resume = self.kv.value, self.admission.kv_cache.resume
        if not self.in_flight or usage is None or usage <= 0:
            return max(1.0, 2 * self.admission.telemetry.poll_interval_ms / 1000.0)
        return self.capacity.mean_duration_s / 2 * max(0.0, usage - resume) / usage
