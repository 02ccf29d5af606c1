"""Replica capacity: what is held, what fits now, and how long until room frees up.

State: the admitted (in-flight) tickets, their reserved tokens and sequences in total,
and the prompt tokens still in prefill. Rules, applied by :meth:`Capacity.fits`:

- reserved tokens <= the budget in force and sequences <= ``maxConcurrency`` (a request holds
  ``sequences x prompts`` of them: ``n`` completions of each prompt of a prompt array run at once);
- class ``c`` may use the budget less the reserved shares of the other classes
  (``reservedShare`` x budget tokens and x concurrency slots each), whether or not those classes
  use them: a reserved share is *headroom* kept free for its class, the way the Gateway API
  Inference Extension keeps its last KV-cache room from sheddable requests. Before, only the
  *unused* part was kept, so once interactive traffic held its 20 % batch could fill the rest and a
  burst of interactive requests found the replica full of batch work (simulator, spike seeds 0-2:
  batch held 44 % of the budget at each interactive refusal; interactive attainment 95.9 % -> 99.0 %
  with batch's own 60 s SLO met 99.0 % -> 91.9 %). The price: a replica serving only the other
  classes keeps the share empty. Lending it to them while its class is away was tried and not kept:
  the first request of a class back after a quiet spell found the replica full of long work and,
  its predicted start past its deadline, was refused where the kept share would have served it
  at once (llama.cpp, 2 slots: 3 of 3 interactive requests refused, 0 before);
- batch composition (``maxPrefillTokens``): prompt tokens in prefill at once are capped; a longer
  prompt waits for the prefills in progress to end, then runs alone;
- a request alone on the replica always runs (it passed the never-fits checks against the
  configured budget), so an adapted-down budget never strands it.

Drain model (for ``retry_after_s``, deadline prediction and shedding), learned from completions:
``d``, the mean duration of successful requests (prior :attr:`EngineTuning.prior_duration_s`);
freeing ``D`` tokens while ``T`` are in flight takes about ``d/2 x D/T`` seconds up to ``T``
(in-flight requests are on average half done), and ``d`` per budget's worth beyond that (queued
work runs whole; a full replica completes ``budget/d`` tokens per second, Little's law): see
:meth:`Capacity.wait_s`. A request's predicted duration is its reserved
tokens x the measured seconds per charged token. Prefill speed is learned from streamed requests'
TTFT and ends the (unobservable) prefill of non-streamed ones.

Backend TTFT (:meth:`Capacity.predicted_ttft_s`): per priority class, the time from forwarding a
request to its first streamed token, smoothed as TCP smooths round-trip times (RFC 6298 section 2:
``mean += (x - mean)/8``, ``dev += (|mean - x| - dev)/4``, first sample ``mean = x``, ``dev = x/2``)
and predicted as ``mean + 4 dev``. The engine takes it from the class TTFT SLO to get the queue
deadline: a request dispatched at that deadline still shows its first token within the SLO.

Adaptive budget (``adaptiveBudget``, on by default): once per window the budget in force moves
with the p95 of backend TTFT / class SLO, within ``minRatio`` .. ``maxRatio`` x ``tokenBudget``.

Pure: times are passed in.
"""

import math
from dataclasses import dataclass, field

from tidegate.admission.breaker import BreakerTuning
from tidegate.admission.ticket import Ticket
from tidegate.api.admission import AdmissionSpec, PriorityClass

ADAPT_MIN_SAMPLES = 20
"""Fewer TTFT samples than this in a window: the adaptive budget does not move."""
ADAPT_BUSY = 0.8
"""The adaptive budget grows only if at least this share of it was in use during the window."""
TTFT_ALPHA, TTFT_BETA, TTFT_K = 1 / 8, 1 / 4, 4
"""Smoothing of the backend TTFT and the weight of its deviation (RFC 6298 section 2's alpha, beta and K)."""


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
    """Weight of each new completed request in the moving averages of the drain model."""
    compact_every_s: float = 10.0
    """How often idle tenant and flow state is forgotten."""
    forget_tenant_after_s: float = 60.0
    """An idle tenant's state (full bucket, nothing accepted) is kept this long after its last use."""
    capacity_wait_s: float = 30.0
    """How long after the model server first answers healthy an unset budget waits for its capacity
    before the fallback (:mod:`tidegate.admission.sizing`); llama.cpp and TGI are read again every 5 s."""


class Capacity:
    """One replica's held capacity and drain model (see the module docstring)."""

    def __init__(self, admission: AdmissionSpec, tuning: EngineTuning, now: float) -> None:
        self.tuning = tuning
        self.in_flight: dict[int, Ticket] = {}
        self.tokens = 0
        self.prefilling_tokens = 0
        self.busy_since_s = now
        self.mean_duration_s = tuning.prior_duration_s
        self.slots = 0  # sequences in flight: the sum of the admitted requests' cost.slots
        self._s_per_token = tuning.prior_s_per_token
        self._prefill_tokens_per_s = tuning.prior_prefill_tokens_per_s
        self._ttft_ratios: list[float] = []
        self._ttft: dict[str, tuple[float, float]] = {}  # class ("" for all) -> (smoothed, deviation)
        self._peak_use = 0.0
        self._adapted_at_s = now
        self.token_budget = admission.token_budget
        self._base_budget: int | None = None
        self.configure(admission, {})

    def configure(self, admission: AdmissionSpec, classes: dict[str, tuple[int, PriorityClass]]) -> None:
        """New settings; an adapted budget is kept (clamped) while ``tokenBudget`` is unchanged."""
        self.admission, self._classes = admission, classes
        # per class: the other classes' reserved shares (of the budget in force) and slots, fixed by the
        # settings, so the admission path looks them up instead of summing them for every request
        self._others = {
            name: (
                sum(k.reserved_share for other, (_, k) in classes.items() if other != name),
                sum(
                    math.floor(k.reserved_share * admission.max_concurrency)
                    for other, (_, k) in classes.items()
                    if other != name
                ),
            )
            for name in (*classes, "")
        }  # "": a class no longer configured (a reload removed it while its requests are held) yields to all
        budget, adaptive = admission.token_budget, admission.adaptive_budget
        if adaptive.enabled and self._base_budget == budget:
            low, high = budget * adaptive.min_ratio, budget * adaptive.max_ratio
            self.token_budget = round(min(max(self.token_budget, low), high))
        else:
            self.token_budget = budget
        self._base_budget = budget

    # ---- holding ------------------------------------------------------------------------------

    def hold(self, ticket: Ticket, now: float) -> None:
        """``ticket`` was admitted: hold its tokens, slot and prefill."""
        if not self.in_flight:
            self.busy_since_s = now
        if ticket.cost.prompt_tokens > 0:
            ticket.prefilling = True
            self.prefilling_tokens += ticket.cost.prompt_tokens
        self.in_flight[ticket.id] = ticket
        self.tokens += ticket.reserved_tokens
        self._peak_use = max(self._peak_use, self.tokens / self.token_budget)
        self.slots += ticket.cost.slots

    def free(self, ticket: Ticket) -> bool:
        """``ticket`` ended: give back what it held. False if it was not held."""
        if self.in_flight.pop(ticket.id, None) is None:
            return False
        self.end_prefill(ticket)
        self.tokens -= ticket.reserved_tokens
        self.slots -= ticket.cost.slots
        return True

    def end_prefill(self, ticket: Ticket) -> bool:
        """``ticket``'s prefill is over; True if it was in prefill."""
        if not ticket.prefilling:
            return False
        ticket.prefilling = False
        self.prefilling_tokens -= ticket.cost.prompt_tokens
        return True

    # ---- what fits ------------------------------------------------------------------------------

    def reserved_for_others(self, name: str) -> tuple[float, float]:
        """The reserved shares of the classes other than ``name``, used or not: (tokens, requests)."""
        share, requests = self._others.get(name) or self._others[""]
        return share * self.token_budget, requests

    def others_share(self, name: str) -> float:
        """The other classes' reserved shares of the budget, 0..1 (:meth:`reserved_for_others`)."""
        return (self._others.get(name) or self._others[""])[0]

    def fits(self, ticket: Ticket) -> tuple[bool, bool]:
        """(fits now, blocked by total capacity rather than only by another class's reservation)."""
        free_tokens = self.token_budget - self.tokens
        free_requests = self.admission.max_concurrency - self.slots
        if not self.in_flight and free_requests >= 1:
            return True, False
        cap = self.admission.max_prefill_tokens
        if cap is not None and self.prefilling_tokens and self.prefilling_tokens + ticket.cost.prompt_tokens > cap:
            return False, True
        if ticket.reserved_tokens > free_tokens or free_requests < ticket.cost.slots:
            return False, True
        tokens, requests = self.reserved_for_others(ticket.priority)
        return ticket.reserved_tokens <= free_tokens - tokens and free_requests - requests >= ticket.cost.slots, False

    def lacks_concurrency(self, ticket: Ticket) -> bool:
        """Whether a slot (rather than tokens) is what ``ticket`` is missing."""
        _, requests = self.reserved_for_others(ticket.priority)
        return self.admission.max_concurrency - self.slots - requests < ticket.cost.slots

    def wait_s(self, ticket: Ticket, ahead_tokens: int, ahead_requests: int) -> float:
        """Predicted seconds until ``ticket`` could start behind ``ahead_*`` queued tokens and
        requests (drain model; the ``retry_after_s`` of capacity refusals).

        With ``d`` the mean duration, ``T`` the tokens in flight and ``B`` the budget this class
        may use, a deficit of ``D`` tokens frees in two phases: the in-flight work, on average
        half done, frees its ``T`` tokens within about ``d/2``; past that the deficit is queued
        work that must itself run, and a full replica completes ``B/d`` tokens per second
        (Little's law, L = λW, with L = B tokens held for W = d)::

            wait = d/2 x min(D, T)/T + d x max(0, D - T)/B

        and the same for requests (in-flight ``N``, slots ``C``); the larger of the two. The first
        phase alone, as before, made a few small requests in flight the only source of free tokens:
        80 tokens in flight before 5080 missing ones predicted 317 s where one duration passes.
        """
        reserved_tokens, reserved_requests = self.reserved_for_others(ticket.priority)
        budget = self.token_budget - reserved_tokens
        slots = self.admission.max_concurrency - reserved_requests
        token_deficit = ahead_tokens + ticket.reserved_tokens - (budget - self.tokens)
        request_deficit = ahead_requests + 1 - (slots - len(self.in_flight))
        return max(
            self._drain_s(token_deficit, self.tokens, budget),
            self._drain_s(request_deficit, len(self.in_flight), slots),
        )

    def backend_wait_s(self, departures: int, running: int) -> float:
        """Predicted seconds until ``departures`` of the model server's ``running`` requests end,
        when it runs no more at once (its own queue is not empty): the same drain model with the
        engine's concurrency as the capacity (``d/2`` for the running ones, ``d`` per full round
        beyond them)."""
        return self._drain_s(departures, running, running)

    def _drain_s(self, deficit: float, in_flight: float, capacity: float) -> float:
        """Seconds to free ``deficit`` units with ``in_flight`` held of ``capacity`` (:meth:`wait_s`)."""
        if deficit <= 0:
            return 0.0
        d = self.mean_duration_s
        return d / 2 * min(deficit, in_flight) / max(in_flight, 1) + d * max(0.0, deficit - in_flight) / max(
            capacity, 1
        )

    # ---- learning -------------------------------------------------------------------------------

    def learn(self, ticket: Ticket, duration_s: float, charged_tokens: int, ttft_s: float | None) -> None:
        """A successful completion teaches the drain model (and the adaptive budget its TTFT)."""
        alpha = self.tuning.duration_alpha
        self.mean_duration_s += alpha * (duration_s - self.mean_duration_s)
        self._s_per_token += alpha * (duration_s / max(1, charged_tokens) - self._s_per_token)
        self.learn_ttft(ticket, ttft_s)

    def learn_ttft(self, ticket: Ticket, ttft_s: float | None) -> None:
        """One backend TTFT sample: for :meth:`predicted_ttft_s` and the adaptive budget (when enabled)."""
        if ttft_s is None or ttft_s < 0:
            return
        for key in (ticket.priority, ""):
            if key not in self._ttft:
                self._ttft[key] = (ttft_s, ttft_s / 2)
                continue
            mean, dev = self._ttft[key]
            dev += TTFT_BETA * (abs(mean - ttft_s) - dev)
            self._ttft[key] = (mean + TTFT_ALPHA * (ttft_s - mean), dev)
        if not self.admission.adaptive_budget.enabled or len(self._ttft_ratios) >= 100_000:
            return
        klass = self._classes.get(ticket.priority)
        if klass is not None:
            self._ttft_ratios.append(ttft_s / (klass[1].ttft_slo_ms / 1000.0))

    def predicted_ttft_s(self, priority: str) -> float:
        """The backend TTFT a request of class ``priority`` should allow for (smoothed + 4 deviations;
        the class's own samples, else all classes', else 0 before any streamed request ended)."""
        mean, dev = self._ttft.get(priority) or self._ttft.get("") or (0.0, 0.0)
        return mean + TTFT_K * dev

    def first_token(self, ticket: Ticket, ttft_s: float | None) -> bool:
        """``ticket``'s first token arrived: prefill over (teaches the prefill speed). True if it was in prefill."""
        if ticket.prefilling and ttft_s is not None and ttft_s > 0 and ticket.cost.prompt_tokens >= 64:
            speed = ticket.cost.prompt_tokens / ttft_s
            self._prefill_tokens_per_s += self.tuning.duration_alpha * (speed - self._prefill_tokens_per_s)
        return self.end_prefill(ticket)

    def end_estimated_prefills(self, now: float) -> None:
        """Non-streamed requests never show a first token: end their prefill after the predicted time."""
        if self.admission.max_prefill_tokens is None or not self.prefilling_tokens:
            return
        speed = self._prefill_tokens_per_s
        for ticket in self.in_flight.values():
            started = ticket.admitted_at_s if ticket.admitted_at_s is not None else now
            if ticket.prefilling and not ticket.cost.stream and now - started >= ticket.cost.prompt_tokens / speed:
                self.end_prefill(ticket)

    def adapt(self, now: float) -> None:
        """One move of the adaptive budget per window (see ``AdaptiveBudgetSpec``)."""
        spec = self.admission.adaptive_budget
        if not spec.enabled or now - self._adapted_at_s < spec.window_seconds:
            return
        ratios, peak = self._ttft_ratios, self._peak_use
        self._ttft_ratios, self._peak_use, self._adapted_at_s = [], self.tokens / self.token_budget, now
        if len(ratios) < ADAPT_MIN_SAMPLES:
            return
        ratios.sort()
        p95 = ratios[min(len(ratios) - 1, math.ceil(0.95 * len(ratios)) - 1)]
        base = self.admission.token_budget
        if p95 > 1.0:
            self.token_budget = max(round(base * spec.min_ratio), round(self.token_budget * (1 - spec.step)))
        elif p95 < spec.grow_below and peak >= ADAPT_BUSY:
            self.token_budget = min(round(base * spec.max_ratio), round(self.token_budget * (1 + spec.step)))

    # ---- shedding -------------------------------------------------------------------------------

    def predicted_duration_s(self, ticket: Ticket) -> float:
        """How long ``ticket`` should run: its reserved tokens x the measured seconds per token."""
        return ticket.reserved_tokens * self._s_per_token

    def overdue(self, now: float) -> list[Ticket]:
        """In-flight requests running past ``shedAfterMultiple`` x their prediction (off: [])."""
        multiple = self.admission.shed_after_multiple
        if multiple is None:
            return []
        floor = self.tuning.shed_floor_s
        return [
            t for t in self.in_flight.values()
            if now - (t.admitted_at_s if t.admitted_at_s is not None else now)
            > max(floor, multiple * self.predicted_duration_s(t))
        ]  # fmt: skip
