"""The admission engine: every decision, the queue and the accounting of one replica.

Decision order for :meth:`Engine.submit` (each step O(1) or O(classes), except the deadline
prediction which scans the bounded queue when it is not empty):

1. class and never-fits checks: unknown class -> ``bad_request``; cost over the replica's
   budget (less the shares reserved for other classes), over the tenant's whole bucket or over its
   ``maxInFlightTokens`` ->
   ``request_too_large`` (final, no ``retry_after_s``);
2. circuit breaker -> ``circuit_open``;
3. system gate (KV cache, GPU memory) -> ``kv_pressure`` / ``gpu_memory``;
4. tenant policy: accepted requests >= ``maxConcurrency``, or accepted tokens over
   ``maxInFlightTokens`` -> ``tenant_concurrency``; bucket short -> ``tenant_rate``;
5. replica capacity: admit at once when nothing is queued and it fits; otherwise queue in the
   weighted-fair queue (:mod:`~tidegate.admission.fairqueue`) unless the predicted start misses
   the deadline (``slo_unreachable``, at once) or the queue is full (a higher class displaces the
   lowest queued request, else ``queue_full``; with queueing disabled ``token_budget`` or
   ``concurrency``). A tenant over ``borrowingCap`` x its fair share of the budget while other
   tenants are active is *demoted*: queued behind every normal request, admitted when room remains.

Priority classes rank by their order in ``priorityClasses`` (first = highest). Class ``c`` may use
the budget less the unused reservations of the other classes (tokens and concurrency alike).
Queued requests are offered in fair-queue order; one blocked by total capacity blocks everything
behind it (no starvation of large requests), one blocked only by another class's reservation lets
that class through.

Invariants (property-tested): reserved tokens in flight never exceed ``tokenBudget``, requests in
flight never exceed ``maxConcurrency``; every admitted ticket is released exactly once; a ticket
that leaves the queue unserved gives back its tenant's tokens and concurrency.

Drain model (for ``retry_after_s`` and deadline prediction): the mean duration ``d`` of recent
successful requests (moving average, prior :attr:`EngineTuning.prior_duration_s`). Freeing ``D``
tokens while ``I`` tokens are in flight takes about ``d/2 x D / I`` seconds (in-flight requests are
on average half done; Little's law).

Batch composition (``maxPrefillTokens``, off by default): prompt tokens of admitted requests whose
first token has not been seen are capped; a longer prompt waits for the prefills in progress, then
runs alone. Streams end their prefill at the first event; non-streamed requests after the prefill
time predicted from the measured prefill speed.

Adaptive budget (``adaptiveBudget``, off by default): the budget in force (:attr:`Engine.token_budget`)
moves once per window with the p95 of backend TTFT / class SLO, within bounds; a request alone on
the replica always runs, so shrinking never strands a request that fits the configured budget.

Pure: the clock is injected, no I/O; the proxy, the simulator and the tests drive it.
"""

import heapq
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from tidegate.admission import cost as costs
from tidegate.admission.breaker import Breaker, BreakerState, BreakerTuning, Completion
from tidegate.admission.fairqueue import FairQueue
from tidegate.admission.gate import GateSignal
from tidegate.admission.reasons import CAPACITY_REASONS, Outcome, Reason
from tidegate.admission.tenants import TenantBook, TenantState, burst_tokens
from tidegate.admission.ticket import Ticket, TicketState, TicketStateError
from tidegate.api.admission import AdmissionSpec, PriorityClass
from tidegate.api.serving import ModelSpec

ADAPT_MIN_SAMPLES = 20
"""Fewer TTFT samples than this in a window: the adaptive budget does not move."""
ADAPT_BUSY = 0.8
"""The adaptive budget grows only if at least this share of it was in use during the window."""


@dataclass(frozen=True, slots=True)
class EngineTuning:
    """Engine knobs not (yet) in the InferencePool API; defaults documented per field."""

    breaker: BreakerTuning = field(default_factory=BreakerTuning)
    frozen_after_s: float = 2.0
    """A KV gauge unchanged this long while nothing is in flight is frozen, not pressure."""
    prior_duration_s: float = 10.0
    """Assumed request duration until a request has completed."""
    prior_prefill_tokens_per_s: float = 5000.0
    """Assumed prefill speed until streamed requests measured it; ends the prefill of non-streamed ones."""
    prior_s_per_token: float = 0.02
    """Assumed seconds per charged token (prompt + output) of one request until one has completed."""
    shed_floor_s: float = 5.0
    """In-flight shedding never aborts a request younger than this, whatever the prediction."""
    duration_alpha: float = 0.1
    """Weight of each new completed request in the mean duration."""
    compact_every_s: float = 10.0
    """How often idle tenant and flow state is forgotten."""


@dataclass(frozen=True, slots=True)
class Telemetry:
    """One reading of the backend and the GPU (``None``: not available)."""

    kv_cache_usage: float | None = None  # 0..1
    gpu_memory_usage: float | None = None  # used / total, 0..1
    generation_tokens_total: float | None = None  # monotonic counter: token progress


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
    rejected_total: Counter[Reason] = field(default_factory=Counter)
    tenants: dict[str, TenantCounts] = field(default_factory=dict)


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
        self.in_flight: dict[int, Ticket] = {}
        self.in_flight_tokens = 0
        self._class_tokens: Counter[str] = Counter()
        self._class_requests: Counter[str] = Counter()
        self._deadlines: list[tuple[float, int, Ticket]] = []
        self._settled: list[Ticket] = []
        self._next_id = 0
        self._mean_duration_s = self.tuning.prior_duration_s
        self._s_per_token = self.tuning.prior_s_per_token
        self._prefill_tokens_per_s = self.tuning.prior_prefill_tokens_per_s
        self.prefilling_tokens = 0
        self._last_progress_s = clock()
        self._busy_since_s = clock()
        self._last_generation_total: float | None = None
        self._compacted_at_s = clock()
        self._active_weight = 0.0
        self._ttft_ratios: list[float] = []
        self._peak_use = 0.0
        self._adapted_at_s = clock()
        self.token_budget = admission.token_budget
        self.breaker = Breaker(admission.circuit_breaker, self.tuning.breaker, clock)
        self.tenants = TenantBook(admission.tenancy)
        self.reconfigure(admission, model)

    # ---- configuration -------------------------------------------------------------------

    def reconfigure(self, admission: AdmissionSpec, model: ModelSpec) -> None:
        """Apply new settings; in-flight and queued requests are kept (nothing is dropped)."""
        self.admission, self.model = admission, model
        self._classes: dict[str, tuple[int, PriorityClass]] = {
            c.name: (rank, c) for rank, c in enumerate(admission.priority_classes)
        }
        budget = admission.token_budget
        adaptive = admission.adaptive_budget
        previous = getattr(self, "admission_budget", None)
        if adaptive.enabled and previous == budget:  # same base budget: keep what was learned
            self.token_budget = round(
                min(max(self.token_budget, budget * adaptive.min_ratio), budget * adaptive.max_ratio)
            )
        else:
            self.token_budget = budget
        self.admission_budget = budget
        reserved = sum(c.reserved_share for c in admission.priority_classes)
        # tokens a class may ever hold (configured budget): the budget less the other classes' reservations
        self._room = {c.name: budget - (reserved - c.reserved_share) * budget for c in admission.priority_classes}
        self.breaker.reconfigure(admission.circuit_breaker)
        self.tenants.reconfigure(admission.tenancy)
        self._active_weight = sum(s.policy.weight for s in self.tenants.states.values() if s.accepted)

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
    def in_flight_requests(self) -> int:
        """Admitted requests not yet released."""
        return len(self.in_flight)

    @property
    def breaker_state(self) -> BreakerState:
        """The circuit breaker's state now."""
        return self.breaker.state

    @property
    def mean_duration_s(self) -> float:
        """Mean duration of recent successful requests (the drain model's ``d``)."""
        return self._mean_duration_s

    def take_settled(self) -> list[Ticket]:
        """Queued tickets that left the queue (admitted or refused) since the last call."""
        settled, self._settled = self._settled, []
        return settled

    # ---- decisions ----------------------------------------------------------------------

    def refuse(
        self, tenant: str, priority: str | None, reason: Reason, message: str, code: str | None = None
    ) -> Ticket:
        """Record a refusal decided before :meth:`submit` (bad body, unknown key, not active)."""
        ticket = self._new_ticket(tenant, priority or self.admission.default_priority_class, costs.RequestCost(0, 0, 1))
        return self._reject(ticket, reason, message, None, code=code)

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
        ticket.deadline_s = now + min(klass.ttft_slo_ms, self.admission.queue.max_wait_ms) / 1000.0
        budget = self.admission.token_budget
        room = self._room[name]
        policy = self.tenants.policy(tenant)
        if cost.reserved_tokens > room:
            return self._reject(
                ticket, Reason.REQUEST_TOO_LARGE,
                f"request needs {cost.reserved_tokens} tokens; class {name!r} may use at most {math.floor(room)} "
                f"of this replica's {budget}-token budget", None, code="request_too_large",
            )  # fmt: skip
        if policy.max_in_flight_tokens is not None and cost.reserved_tokens > policy.max_in_flight_tokens:
            return self._reject(
                ticket, Reason.REQUEST_TOO_LARGE,
                f"request needs {cost.reserved_tokens} tokens; tenant {tenant!r} may hold at most "
                f"{policy.max_in_flight_tokens} in flight", None, code="request_too_large",
            )  # fmt: skip
        if cost.reserved_tokens > burst_tokens(policy):
            return self._reject(
                ticket, Reason.REQUEST_TOO_LARGE,
                f"request needs {cost.reserved_tokens} tokens; tenant {tenant!r} may use at most "
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

        state = self.tenants.state(tenant, now)
        if policy.max_concurrency is not None and state.accepted >= policy.max_concurrency:
            return self._reject(
                ticket, Reason.TENANT_CONCURRENCY,
                f"tenant {tenant!r} has {state.accepted} requests in progress (limit {policy.max_concurrency})",
                self._mean_duration_s / 2,
            )  # fmt: skip
        cap = policy.max_in_flight_tokens
        if cap is not None and state.accepted_tokens + cost.reserved_tokens > cap:
            return self._reject(
                ticket, Reason.TENANT_CONCURRENCY,
                f"tenant {tenant!r} holds {state.accepted_tokens} tokens queued or in flight (limit {cap})",
                self._mean_duration_s / 2,
            )  # fmt: skip
        rate_wait = state.rate_wait_s(cost.reserved_tokens, now)
        if rate_wait > 0:
            return self._reject(
                ticket, Reason.TENANT_RATE,
                f"tenant {tenant!r} is over {policy.tokens_per_second:g} tokens/s", rate_wait,
            )  # fmt: skip

        weight = policy.weight * klass.weight
        if self._over_fair_share(tenant, state.running_tokens + cost.reserved_tokens, policy.weight):
            ticket.outcome = Outcome.ADMIT_DEMOTED
        else:
            ticket.outcome = Outcome.ADMIT
        if self.queue.depth == 0 and not ticket.demoted and self._fits(ticket)[0]:
            self._accept(ticket, state, now)
            self.queue.tag(ticket, weight)
            self.queue.served(ticket)
            self._admit(ticket, now)
            return ticket
        return self._enqueue(ticket, state, weight, now)

    def _enqueue(self, ticket: Ticket, state: TenantState, weight: float, now: float) -> Ticket:
        max_depth = self.admission.queue.max_depth
        if max_depth == 0:
            if ticket.demoted and self._fits(ticket)[0]:
                self._accept(ticket, state, now)
                self.queue.tag(ticket, weight)
                self.queue.served(ticket)
                self._admit(ticket, now)
                return ticket
            reason = Reason.CONCURRENCY if self._lacks_concurrency(ticket) else Reason.TOKEN_BUDGET
            return self._reject(ticket, reason, "replica at capacity", self._wait_s(ticket, 0, 0))
        finish = self.queue.peek_finish(ticket.tenant, ticket.priority, ticket.reserved_tokens, weight)
        ahead_tokens, ahead_requests = self.queue.ahead_of(ticket.demoted, finish)
        wait = self._wait_s(ticket, ahead_tokens, ahead_requests)
        if now + wait > ticket.deadline_s:
            return self._reject(
                ticket, Reason.SLO_UNREACHABLE,
                f"predicted start in {wait:.2f} s misses the {ticket.priority!r} deadline", wait,
            )  # fmt: skip
        if self.queue.depth >= max_depth:
            victim = self.queue.lowest_priority()
            if victim is None or victim.rank <= ticket.rank:
                return self._reject(
                    ticket, Reason.QUEUE_FULL, "admission queue full", self._wait_s(ticket, *self._queue_totals())
                )
            self._leave_queue(victim)
            self.counters.displaced_total += 1
            self._reject(
                victim,
                Reason.QUEUE_FULL,
                "displaced by a higher-priority request",
                self._wait_s(victim, *self._queue_totals()),
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
        if ticket.state is not TicketState.ADMITTED or self.in_flight.pop(ticket.id, None) is None:
            raise TicketStateError(f"ticket {ticket.id} is {ticket.state.value}, not admitted: cannot release")
        now = self.clock()
        self._end_prefill(ticket)
        ticket.state, ticket.released_at_s = TicketState.RELEASED, now
        self.in_flight_tokens -= ticket.reserved_tokens
        self._class_tokens[ticket.priority] -= ticket.reserved_tokens
        self._class_requests[ticket.priority] -= 1
        charged = used_tokens if used_tokens is not None and used_tokens > 0 else ticket.reserved_tokens
        if not (used_tokens is not None if usage_reported is None else usage_reported):
            self.counters.usage_missing_total += 1
        ticket.charged_tokens = charged
        self.counters.completed_total += 1
        self.counters.charged_tokens_total += charged
        state = self.tenants.state(ticket.tenant, now)
        state.running_tokens -= ticket.reserved_tokens
        state.give_back(ticket.reserved_tokens - charged, now)
        self._unaccept(ticket, state)
        self.breaker.record(completion, ttft_s, ticket.probe_epoch)
        if ttft_s is not None and self.admission.adaptive_budget.enabled and len(self._ttft_ratios) < 100_000:
            klass = self._classes.get(ticket.priority)
            if klass is not None:
                self._ttft_ratios.append(ttft_s / (klass[1].ttft_slo_ms / 1000.0))
        if completion is Completion.SUCCESS:
            self._last_progress_s = now
            duration = now - (ticket.admitted_at_s or now)
            self._mean_duration_s += self.tuning.duration_alpha * (duration - self._mean_duration_s)
            per_token = duration / max(1, charged)
            self._s_per_token += self.tuning.duration_alpha * (per_token - self._s_per_token)
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
        if self.queue.depth == 0 or self._gate_reason(self.clock()) is not None:
            return admitted
        now = self.clock()
        progress = True
        while progress and self.queue.depth:
            progress = False
            for ticket in self.queue.candidates(self._still_demoted):
                fits, blocked_by_total = self._fits(ticket)
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
                             self._wait_s(ticket, *self._queue_totals()))  # fmt: skip
                self._settled.append(ticket)
                expired.append(ticket)
        return expired

    def tick(self) -> list[Ticket]:
        """Periodic upkeep (call every ~50-100 ms): expiry, stall check, breaker, dispatch,
        forgetting idle tenants. Returns the tickets settled since the last call."""
        now = self.clock()
        self.expire()
        self.breaker.check_stall(self.in_flight_requests, max(self._last_progress_s, self._busy_since_s))
        if self.breaker.state is BreakerState.OPEN and self.queue.depth:
            for ticket in list(self.queue.queued()):
                self._leave_queue(ticket)
                self._reject(ticket, Reason.CIRCUIT_OPEN, "the model server is degraded; circuit open",
                             self.breaker.retry_after_s() or 1.0)  # fmt: skip
                self._settled.append(ticket)
        self._adapt_budget(now)
        self._end_estimated_prefills(now)
        self.dispatch()
        if now - self._compacted_at_s >= self.tuning.compact_every_s:
            self._compacted_at_s = now
            self.tenants.prune(now)
            self.queue.compact()
        return self.take_settled()

    def _adapt_budget(self, now: float) -> None:
        """One move of the adaptive budget per window (see ``AdaptiveBudgetSpec``)."""
        spec = self.admission.adaptive_budget
        if not spec.enabled or now - self._adapted_at_s < spec.window_seconds:
            return
        ratios, peak = self._ttft_ratios, self._peak_use
        self._ttft_ratios, self._peak_use, self._adapted_at_s = [], self.in_flight_tokens / self.token_budget, now
        if len(ratios) < ADAPT_MIN_SAMPLES:
            return
        ratios.sort()
        p95 = ratios[min(len(ratios) - 1, math.ceil(0.95 * len(ratios)) - 1)]
        base = self.admission.token_budget
        if p95 > 1.0:
            self.token_budget = max(round(base * spec.min_ratio), round(self.token_budget * (1 - spec.step)))
        elif p95 < spec.grow_below and peak >= ADAPT_BUSY:
            self.token_budget = min(round(base * spec.max_ratio), round(self.token_budget * (1 + spec.step)))

    def first_token(self, ticket: Ticket, ttft_s: float | None = None) -> None:
        """The backend produced ``ticket``'s first token: its prefill is over (``ttft_s`` teaches the
        prefill speed used for requests whose first token is not seen, i.e. non-streamed ones)."""
        if ticket.prefilling and ttft_s is not None and ttft_s > 0 and ticket.cost.prompt_tokens >= 64:
            speed = ticket.cost.prompt_tokens / ttft_s
            self._prefill_tokens_per_s += self.tuning.duration_alpha * (speed - self._prefill_tokens_per_s)
        if self._end_prefill(ticket):
            self.dispatch()

    def _end_prefill(self, ticket: Ticket) -> bool:
        if not ticket.prefilling:
            return False
        ticket.prefilling = False
        self.prefilling_tokens -= ticket.cost.prompt_tokens
        return True

    def _end_estimated_prefills(self, now: float) -> None:
        """Non-streamed requests never show a first token: end their prefill after the predicted time."""
        if self.admission.max_prefill_tokens is None or not self.prefilling_tokens:
            return
        speed = self._prefill_tokens_per_s
        for ticket in self.in_flight.values():
            if (
                ticket.prefilling
                and not ticket.cost.stream
                and now - (ticket.admitted_at_s or now) >= ticket.cost.prompt_tokens / speed
            ):
                self._end_prefill(ticket)

    def predicted_duration_s(self, ticket: Ticket) -> float:
        """How long ``ticket`` should run: its reserved tokens x the measured seconds per token."""
        return ticket.reserved_tokens * self._s_per_token

    def overdue(self) -> list[Ticket]:
        """In-flight requests running past ``shedAfterMultiple`` x their predicted time (off: [])."""
        multiple = self.admission.shed_after_multiple
        if multiple is None:
            return []
        now, floor = self.clock(), self.tuning.shed_floor_s
        return [
            t for t in self.in_flight.values()
            if now - (t.admitted_at_s or now) > max(floor, multiple * self.predicted_duration_s(t))
        ]  # fmt: skip

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
        total = reading.generation_tokens_total
        if total is not None:
            if self._last_generation_total is not None and total > self._last_generation_total:
                self._last_progress_s = now
            self._last_generation_total = total
        self.dispatch()

    # ---- internals ----------------------------------------------------------------------

    def _new_ticket(self, tenant: str, priority: str, cost: costs.RequestCost) -> Ticket:
        self._next_id += 1
        return Ticket(id=self._next_id, tenant=tenant, priority=priority, cost=cost, submitted_at_s=self.clock())

    def _tenant_counts(self, tenant: str) -> TenantCounts:
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
        state = self.tenants.state(ticket.tenant, now)
        state.give_back(ticket.reserved_tokens, now)
        self._unaccept(ticket, state)
        if ticket.probe_epoch is not None:
            self.breaker.record(Completion.CANCELLED, None, ticket.probe_epoch)
            ticket.probe_epoch = None

    def _admit(self, ticket: Ticket, now: float) -> None:
        if not self.in_flight:
            self._busy_since_s = now
        ticket.state, ticket.admitted_at_s = TicketState.ADMITTED, now
        if ticket.cost.prompt_tokens > 0:
            ticket.prefilling = True
            self.prefilling_tokens += ticket.cost.prompt_tokens
        self.in_flight[ticket.id] = ticket
        self.in_flight_tokens += ticket.reserved_tokens
        self._peak_use = max(self._peak_use, self.in_flight_tokens / self.token_budget)
        self.tenants.state(ticket.tenant, now).running_tokens += ticket.reserved_tokens
        self._class_tokens[ticket.priority] += ticket.reserved_tokens
        self._class_requests[ticket.priority] += 1
        self.counters.admitted_total += 1
        self.counters.admitted_tokens_total += ticket.reserved_tokens
        counts = self._tenant_counts(ticket.tenant)
        counts.admitted += 1
        counts.admitted_tokens += ticket.reserved_tokens
        if ticket.demoted:
            self.counters.admitted_demoted_total += 1
            counts.demoted += 1

    def _reserved_for_others(self, name: str) -> tuple[float, float]:
        """Unused reservations of the other classes: (tokens, requests)."""
        tokens = requests = 0.0
        for other, (_, klass) in self._classes.items():
            if other != name and klass.reserved_share > 0:
                tokens += max(0.0, klass.reserved_share * self.token_budget - self._class_tokens[other])
                reserved_requests = math.floor(klass.reserved_share * self.admission.max_concurrency)
                requests += max(0, reserved_requests - self._class_requests[other])
        return tokens, requests

    def _fits(self, ticket: Ticket) -> tuple[bool, bool]:
        """(fits now, blocked by total capacity rather than by another class's reservation)."""
        free_tokens = self.token_budget - self.in_flight_tokens
        free_requests = self.admission.max_concurrency - len(self.in_flight)
        if not self.in_flight and free_requests >= 1:
            return True, False  # alone it always runs, even over an adapted-down budget
        cap = self.admission.max_prefill_tokens
        if cap is not None and self.prefilling_tokens and self.prefilling_tokens + ticket.cost.prompt_tokens > cap:
            return False, True  # wait for the prefills in progress (a long prompt then runs alone)
        if ticket.reserved_tokens > free_tokens or free_requests < 1:
            return False, True
        tokens, requests = self._reserved_for_others(ticket.priority)
        return ticket.reserved_tokens <= free_tokens - tokens and free_requests - requests >= 1, False

    def _lacks_concurrency(self, ticket: Ticket) -> bool:
        _, requests = self._reserved_for_others(ticket.priority)
        return self.admission.max_concurrency - len(self.in_flight) - requests < 1

    def _over_fair_share(self, tenant: str, tokens: int, weight: float) -> bool:
        """Would ``tokens`` accepted put the tenant over ``borrowingCap`` x its fair share?"""
        state = self.tenants.states.get(tenant)
        active = self._active_weight + (0.0 if state is not None and state.accepted else weight)
        if active <= weight + 1e-9:
            return False  # alone: all idle capacity is its to borrow
        share = self.token_budget * weight / active
        return tokens > self.admission.tenancy.borrowing_cap * share

    def _still_demoted(self, ticket: Ticket) -> bool:
        state = self.tenants.states.get(ticket.tenant)
        running = state.running_tokens if state is not None else 0
        return self._over_fair_share(
            ticket.tenant, running + ticket.reserved_tokens, self.tenants.policy(ticket.tenant).weight
        )

    def _queue_totals(self) -> tuple[int, int]:
        return self.queue.tokens, self.queue.depth

    def _wait_s(self, ticket: Ticket, ahead_tokens: int, ahead_requests: int) -> float:
        """Predicted seconds until ``ticket`` could start behind ``ahead_*`` (drain model)."""
        reserved_tokens, reserved_requests = self._reserved_for_others(ticket.priority)
        free_tokens = self.token_budget - self.in_flight_tokens - reserved_tokens
        free_requests = self.admission.max_concurrency - len(self.in_flight) - reserved_requests
        token_deficit = ahead_tokens + ticket.reserved_tokens - free_tokens
        request_deficit = ahead_requests + 1 - free_requests
        residual = self._mean_duration_s / 2
        wait = 0.0
        if token_deficit > 0:
            wait = residual * token_deficit / max(self.in_flight_tokens, 1)
        if request_deficit > 0:
            wait = max(wait, residual * request_deficit / max(len(self.in_flight), 1))
        return wait

    def _gate_reason(self, now: float) -> Reason | None:
        if self.kv.value is None and self.gpu.value is None:
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

    def _gate_wait_s(self) -> float:
        """Time for in-flight work to bring KV usage under ``resume`` (drain model)."""
        usage, resume = self.kv.value, self.admission.kv_cache.resume
        if not self.in_flight or usage is None or usage <= 0:
            return max(1.0, 2 * self.admission.telemetry.poll_interval_ms / 1000.0)
        return self._mean_duration_s / 2 * max(0.0, usage - resume) / usage
