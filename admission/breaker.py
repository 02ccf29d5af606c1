"""Circuit breaker on backend degradation: closed -> open -> half-open -> closed (or open again).

Trips (only while closed) on:

- **latency**: the fast moving average of TTFT over its limit above 1, where each response's limit
  is ``latencyMultiplier`` x the calibrated baseline **of the prefill work it met** (never below
  :attr:`BreakerTuning.latency_floor_s`, so microsecond jitter on an idle server cannot trip it)
  and never below the tightest class TTFT SLO (:attr:`Breaker.slo_floor_s`). The prefill work of
  a request (``work_tokens``, the engine passes it) is its own prompt tokens plus those of the
  requests admitted before it and still prefilling when it was admitted: a model server fills
  each step's token budget with the running decodes first, then with the waiting prompts in
  arrival order (vLLM's scheduler, ``max_num_batched_tokens``, ``vllm.config.scheduler`` in
  v0.10), so a request's first token waits for that work. "Still prefilling" is as the engine
  tracks it: until the first token of a streamed request, the predicted prefill time of a
  non-streamed one under ``maxPrefillTokens``, else until it ends (then the work over-counts
  what is in the way, but alike for the baseline and the judged response; the policy simulator
  reported no first tokens before it called ``Engine.first_token`` (issue #13), so the simulator
  figures below measured it as the prompt tokens in flight, a load measure as much as a size).
  Baselines are kept per bucket of it
  (up to :attr:`BreakerTuning.work_bucket_min_tokens`, then one bucket per doubling: within a
  bucket the work differs by at most 2x, under the default multiplier of 3); a bucket's baseline
  is a slow moving average of its healthy TTFTs, trusted after ``minSamples`` of them. A response
  in a bucket not yet trusted is judged against the nearest trusted smaller bucket's baseline
  scaled by the work (x2 per bucket: prefill time grows about linearly with the tokens, and a
  fixed per-request overhead only makes the scaled value an overestimate), else against the
  nearest trusted larger bucket's (less work never takes longer), and teaches its own bucket
  only when within that limit: a replica that turned slow, and so queues more prefill work than
  it ever did, is judged on the new work instead of learning it as healthy (in the simulator,
  one ``spike`` replica slowed 10x at 600 s, seed 0: its breaker opened at 814 s while new
  buckets were left unjudged, at 784 s with the scaled limit, at 782 s with the pooled baseline
  of before; no other replica's opened). So a replica slow **for the work in its way** trips (TTFT x10 at light load, or a GPU
  throttled under the load it always carried), and a replica merely busy, or serving long
  prompts, does not: its TTFT is compared with what that much work took when healthy. Why: one
  pooled baseline, learned mostly from short prompts on a lightly loaded replica, opened the
  breaker on full replicas and on long prompts (issue #13). In the policy simulator with the
  breaker off (``spike`` seed 1, default config), healthy TTFT over the light-load (<= 20% of
  the budget) median of its bucket had a p90 of 1.2x at <= 10% of the token budget in flight and
  9.2x at 40-50% when bucketed by its own prompt tokens, and stayed between 2.5x and 3.4x up to
  40% when bucketed by prefill work; on a 34B model on an A100 (``mixed-34b-a100`` seed 0, loads
  up to 50%) 4.1x-9.1x by prompt, 1.4x-2.5x by prefill work. With the pooled baseline the breaker
  refused 1003 requests ``circuit_open`` in ``spike`` (seeds 0-2), 214 in ``replica-lost`` and
  214 in ``mixed-34b-a100``, whose replicas are never slow; with prefill-work baselines, none. Refusing
  a busy replica for a cooldown would turn it into a missing one; load is admission's business
  (the adaptive budget answers TTFT over the class SLO by admitting less). **Streamed responses
  only**: a non-streamed answer has no TTFT (its
  response headers come with the last token), and its end-to-end time grows with its output
  length and with the batch it shares the GPU with, so there is no load-independent baseline to
  compare it with; a latency trip on it would open the breaker on ordinary long answers under
  load. Non-streamed responses count for the error trip (5xx, timeouts) and for the stall
  detector (the backend's token counter, vLLM and llama.cpp), and ``shedAfterMultiple`` bounds
  one running far past its prediction; they neither calibrate nor trip the latency trip, and a
  non-streamed half-open probe is judged by its outcome alone;
- **errors**: the share of failures in the last ``windowSeconds`` above ``errorRatio`` (with at
  least ``minSamples`` decisive responses), or :attr:`BreakerTuning.consecutive_failures` in a
  row (a burst of 5xx);
- **stall**: requests in flight and no token progress for the stall window (a hung backend whose
  ``/health`` still answers): :attr:`BreakerTuning.stall_s`, but at most
  :attr:`BreakerTuning.stall_timeout_fraction` of ``requestTimeoutSeconds`` (a hung request would
  otherwise time out, one ordinary failure, before a stall could be seen). Half-open, the window
  starts no earlier than the first probe, so requests stuck since before the trip cannot re-open
  the breaker before a probe had time to progress. The engine calls :meth:`Breaker.check_stall`.

**When** each piece of evidence counts (one request is one sample for each judgement). A streamed
request's TTFT is judged when its first token arrives (:meth:`Breaker.first_token`, the engine
calls it from :meth:`~tidegate.admission.engine.Engine.first_token`): the latency average, the
baseline it may teach, the latency trip, and a half-open probe's "slow" verdict; its end is
then recorded (:meth:`Breaker.record`) with the outcome alone, for the error trips and the probe's
outcome, and its TTFT is not counted again. Why: a request ends when its generation does, minutes
after its first token for long outputs, and a breaker that learned TTFT only then kept a replica
turned slow in service that long (simulator, ``mixed-34b-a100``, one replica 10x slower at 600 s,
seeds 0-2: opened at 957 / 682 / 784 s when TTFT came with the end, at 626 / 610 / 634 s at the
first token; ``spike``: 784 / 803 / 797 s, now 626 / 643 / 648 s). The error window holds
outcomes at the time each request ended, as before; the latency average moves at each first
token, so a trip on it happens at a first token and the error trips at an end. A probe whose
first token is slow is a failed probe at once (the breaker reopens as soon as the failures are
over ``halfOpenSuccessRatio``'s allowance) and its end no longer counts as a probe; a probe whose
first token is in time is decided by how it ends. A first token judged while open or half-open
(a request admitted before the trip) moves the average but teaches no baseline, as before. A
request cancelled after its first token (the client went away) has given its TTFT, which counts;
the cancellation itself is neutral. A response with no first token seen (non-streamed; the
engine never calls :meth:`Breaker.first_token` for it) has its TTFT, if any, judged at its end, as
before: then only a decisive, successful outcome teaches or trips on latency.

**Tenant attribution** (no client can trip the breaker for the others). Every decisive outcome
(success, failure) is recorded with its tenant. The *suspect* is the tenant with the most failures
in the window, provided a **different** tenant has a success in the window. While there is a
suspect, both error trips leave the suspect's outcomes out: the ratio trip counts only the other
tenants' decisive outcomes in the window (still at least ``minSamples`` of them), and the
consecutive trip counts only the other tenants' failures since the last success. Half-open, a
failed probe of the suspect frees its slot, like a neutral outcome. Consequences: failures of a
single tenant while another tenant succeeded within the window never trip the breaker; with one
tenant (or nobody else succeeding within the window) everything counts as before; a replica that
fails everyone still trips, on the other tenants' failures, or with all of them once the last
success of another tenant has left the window. Latency and stall trips judge the replica, not a
tenant, and are not attributed.

Upstream 429 is *neutral* (the backend protecting itself is not degradation), so are the upstream
errors the proxy judges to be the client's doing (:mod:`tidegate.admission.blame`), and ``/health``
is never consulted. Open: every request is refused (``circuit_open``) until the cooldown ends;
cooldowns double on each re-open, ``cooldownSeconds`` -> x2 -> ... capped at
``maxCooldownSeconds`` (60 -> 120 -> 240 -> 300 s by default), and reset once it closes.
Half-open: every other arrival is let through as a probe until ``halfOpenRequests`` probes have a
decisive outcome; it closes when the success share reaches ``halfOpenSuccessRatio`` and reopens
as soon as that share is out of reach. A probe whose outcome is neutral or cancelled frees its
slot for another probe, so the breaker can never lock itself out; outcomes of probes from an
earlier half-open period (``epoch``) are ignored as probes.

Every change of state (trip, cooldown over, close) is reported through the optional
``on_transition(old, new, reason)`` callback, so the caller can log it; the breaker itself does no
I/O.

Pure: injected clock, no I/O.
"""

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from tidegate.api.admission import CircuitBreakerSpec


class BreakerState(StrEnum):
    """Circuit breaker states (same values as ``tidegate.admission.stats.BreakerState``)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Completion(StrEnum):
    """How an admitted request ended, as the breaker and the accounting see it."""

    SUCCESS = "success"  # the backend answered (2xx), stream completed
    FAILURE = "failure"  # 5xx, connection error, timeout, stall
    NEUTRAL = "neutral"  # upstream 429 or 4xx: the backend is fine, the request was not
    CANCELLED = "cancelled"  # the client went away; says nothing about the backend


@dataclass(frozen=True, slots=True)
class BreakerTuning:
    """Breaker knobs not in the InferencePool API (defaults documented here)."""

    stall_s: float = 30.0
    """No token progress for this long while requests are in flight trips the breaker."""
    stall_timeout_fraction: float = 0.5
    """The stall window is at most this fraction of the request timeout (see :meth:`Breaker.stall_window_s`)."""
    latency_floor_s: float = 0.25
    """The latency trip threshold is ``latencyMultiplier x max(baseline, floor)``."""
    work_bucket_min_tokens: int = 128
    """Upper edge of the smallest prefill-work bucket; each next bucket doubles it (module docstring)."""
    consecutive_failures: int = 5
    """Failures in a row that trip the breaker regardless of the window's ratio."""


Transition = Callable[[BreakerState, BreakerState, str], None]
"""``on_transition(old, new, reason)``: called on every change of state."""


class _TenantTally:
    """Decisive outcomes per tenant over the window, with the tenant of most failures at hand in O(1)
    (tenants bucketed by their failure count; counts move by one)."""

    def __init__(self) -> None:
        self.ok: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self._by_failures: dict[int, dict[str, None]] = {}  # failures -> tenants with that many
        self._most = 0

    def add(self, tenant: str, failed: bool) -> None:
        if not failed:
            self.ok[tenant] += 1
            return
        had = self.failed[tenant]
        self._move(tenant, had, had + 1)
        self._most = max(self._most, had + 1)

    def remove(self, tenant: str, failed: bool) -> None:
        if not failed:
            self.ok[tenant] -= 1
            if self.ok[tenant] <= 0:
                del self.ok[tenant]
            return
        had = self.failed[tenant]
        self._move(tenant, had, had - 1)
        if had == self._most and had not in self._by_failures:
            self._most -= 1

    def _move(self, tenant: str, old: int, new: int) -> None:
        if old:
            bucket = self._by_failures[old]
            del bucket[tenant]
            if not bucket:
                del self._by_failures[old]
        if new:
            self._by_failures.setdefault(new, {})[tenant] = None
            self.failed[tenant] = new
        else:
            del self.failed[tenant]

    def suspect(self) -> str | None:
        """The tenant with the most failures, when a different tenant has a success (module docstring)."""
        if not self._most:
            return None
        tenant = next(iter(self._by_failures[self._most]))
        others_ok = len(self.ok) - (tenant in self.ok)
        return tenant if others_ok > 0 else None

    def clear(self) -> None:
        self.ok.clear()
        self.failed.clear()
        self._by_failures.clear()
        self._most = 0


def _among(failures: Counter[str], suspect: str | None) -> str:
    """`` from N tenants[, not counting 'x']`` for a trip reason."""
    tenants = sum(1 for t, k in failures.items() if k > 0 and t != suspect)
    return f" from {tenants} tenant{'s' * (tenants != 1)}" + (f", not counting {suspect!r}" if suspect else "")


class Breaker:
    """The circuit breaker of one replica. All times are seconds from ``clock``."""

    def __init__(
        self,
        spec: CircuitBreakerSpec,
        tuning: BreakerTuning,
        clock: Callable[[], float],
        on_transition: Transition | None = None,
    ) -> None:
        self.spec, self.tuning, self._clock = spec, tuning, clock
        self._on_transition = on_transition
        self._state = BreakerState.CLOSED
        self.epoch = 0
        self.trips = 0  # consecutive opens without a close; sets the cooldown
        self.open_until_s = 0.0
        self.last_trip_reason = ""
        self._window: deque[tuple[float, bool, str]] = deque()  # (time, failed, tenant) of decisive outcomes
        self._failed_in_window = 0
        self._tally = _TenantTally()
        self._consecutive_failures = 0
        self._streak: Counter[str] = Counter()  # failures since the last success, by tenant
        self.slo_floor_s = 0.0  # the tightest class TTFT SLO (the engine sets it): no latency trip below it
        self._baselines: dict[int, tuple[float, int]] = {}  # work bucket -> (healthy TTFT, samples)
        self._recent: float | None = None  # fast moving average of judged TTFT / its bucket's limit (> 1 trips)
        self._last_judged = (0.0, 0.0, 0)  # (TTFT, limit, work tokens) of the last judged sample, for the reason
        self._arrivals = 0
        self._probes_out = 0
        self._probe_ok = 0
        self._probe_failed = 0
        self._first_probe_s: float | None = None  # when this half-open period let its first probe through

    def reconfigure(self, spec: CircuitBreakerSpec) -> None:
        """Take new settings, keeping state and history."""
        self.spec = spec

    @property
    def state(self) -> BreakerState:
        """Current state; an open breaker whose cooldown has ended reads as half-open."""
        if self._state is BreakerState.OPEN and self._clock() >= self.open_until_s:
            self._state = BreakerState.HALF_OPEN
            self._arrivals = self._probes_out = self._probe_ok = self._probe_failed = 0
            self._first_probe_s = None
            self._report(
                BreakerState.OPEN, f"cooldown over: letting {self.spec.half_open_requests} probe requests through"
            )
        return self._state

    def _bucket(self, work_tokens: int) -> int:
        """The prefill-work bucket: 0 up to ``work_bucket_min_tokens``, then one per doubling."""
        edge = self.tuning.work_bucket_min_tokens
        return max(0, (max(work_tokens, 1) - 1).bit_length() - (edge - 1).bit_length())

    @property
    def baseline_ttft_s(self) -> float | None:
        """Calibrated healthy TTFT of the smallest prefill work (:meth:`baseline_for` of 0)."""
        return self.baseline_for(0)

    def baseline_for(self, work_tokens: int) -> float | None:
        """Calibrated healthy TTFT of a request that met ``work_tokens`` of prefill work (its own
        prompt and the prompts still prefilling ahead of it); None until its bucket has seen
        ``minSamples`` healthy responses."""
        baseline, samples = self._baselines.get(self._bucket(work_tokens), (0.0, 0))
        return baseline if samples >= self.spec.min_samples else None

    def expected_ttft_s(self, work_tokens: int) -> float | None:
        """Healthy TTFT for ``work_tokens`` of prefill work: its bucket's baseline once calibrated;
        else the nearest calibrated smaller bucket's scaled by the work (x2 a bucket), else the
        nearest calibrated larger bucket's; None while no bucket is calibrated (module docstring)."""
        bucket = self._bucket(work_tokens)
        own = self.baseline_for(work_tokens)
        if own is not None:
            return own
        trusted = [b for b, (_, n) in self._baselines.items() if n >= self.spec.min_samples]
        below = max((b for b in trusted if b < bucket), default=None)
        if below is not None:
            return self._baselines[below][0] * 2.0 ** (bucket - below)
        above = min((b for b in trusted if b > bucket), default=None)
        return None if above is None else self._baselines[above][0]

    def latency_limit_s(self, work_tokens: int = 0) -> float | None:
        """TTFT above which a response that met ``work_tokens`` of prefill work counts as degraded
        (None while no bucket is calibrated): ``latencyMultiplier x max(expected, floor)`` with
        :meth:`expected_ttft_s`, never below :attr:`slo_floor_s`."""
        expected = self.expected_ttft_s(work_tokens)
        if expected is None:
            return None
        return max(self.spec.latency_multiplier * max(expected, self.tuning.latency_floor_s), self.slo_floor_s)

    def allow(self) -> tuple[bool, int | None]:
        """May a new request pass? Returns ``(allowed, probe_epoch)``; ``probe_epoch`` is set for probes."""
        if not self.spec.enabled:
            return True, None
        state = self.state
        if state is BreakerState.CLOSED:
            return True, None
        if state is BreakerState.OPEN:
            return False, None
        self._arrivals += 1
        slots = self.spec.half_open_requests - self._probes_out - self._probe_ok - self._probe_failed
        if slots > 0 and self._arrivals % 2 == 1:
            self._probes_out += 1
            if self._first_probe_s is None:
                self._first_probe_s = self._clock()
            return True, self.epoch
        return False, None

    def retry_after_s(self) -> float:
        """Seconds until the breaker may let requests through again (>= 0)."""
        if self.state is BreakerState.OPEN:
            return max(0.0, self.open_until_s - self._clock())
        return 0.0

    def record(
        self,
        outcome: Completion,
        ttft_s: float | None = None,
        probe_epoch: int | None = None,
        tenant: str = "",
        work_tokens: int = 0,
    ) -> None:
        """One admitted request of ``tenant`` ended with ``outcome``; ``ttft_s`` when a first token
        was seen; ``probe_epoch`` as :meth:`allow` returned it; ``work_tokens``: the prefill work
        it met when admitted (its prompt tokens plus those of the requests still prefilling ahead
        of it; 0 when unknown)."""
        limit = self.latency_limit_s(work_tokens)
        slow = ttft_s is not None and limit is not None and ttft_s > limit
        decisive = outcome in (Completion.SUCCESS, Completion.FAILURE)
        failed = outcome is Completion.FAILURE
        if decisive:
            self._observe(self._clock(), failed, tenant)
        if probe_epoch is not None and probe_epoch == self.epoch and self.state is BreakerState.HALF_OPEN:
            self._probes_out = max(0, self._probes_out - 1)
            if failed and self._tally.suspect() == tenant:
                return  # one tenant failing while others succeed: a verdict on the tenant, not the replica
            if failed or (outcome is Completion.SUCCESS and slow):
                self._probe_failed += 1
            elif outcome is Completion.SUCCESS:
                self._probe_ok += 1
            self._decide_half_open()
            return
        if not decisive:
            return
        if ttft_s is not None and not failed:
            self._learn_ttft(ttft_s, limit, work_tokens)
        if self._state is BreakerState.CLOSED and self.spec.enabled:
            self._check_trip()

    def first_token(self, ttft_s: float, probe_epoch: int | None = None, work_tokens: int = 0) -> bool:
        """A streamed request's first token came ``ttft_s`` after it was forwarded: its latency
        evidence, judged now rather than when the request ends (module docstring, *When*). The
        caller then records its end with :meth:`record` without ``ttft_s``. ``probe_epoch`` and
        ``work_tokens`` as for :meth:`record`. Returns True when this decided a half-open probe (a
        slow first token: a failed probe); its end is then no probe (the caller drops its
        ``probe_epoch``), so it counts once."""
        limit = self.latency_limit_s(work_tokens)
        if probe_epoch is not None and probe_epoch == self.epoch and self.state is BreakerState.HALF_OPEN:
            if limit is None or ttft_s <= limit:
                return False  # its outcome decides the probe when it ends
            self._probes_out = max(0, self._probes_out - 1)
            self._probe_failed += 1
            self._decide_half_open()
            return True
        self._learn_ttft(ttft_s, limit, work_tokens)
        if self._state is BreakerState.CLOSED and self.spec.enabled:
            self._check_latency()
        return False

    def _observe(self, now: float, failed: bool, tenant: str) -> None:
        self._window.append((now, failed, tenant))
        self._failed_in_window += failed
        self._tally.add(tenant, failed)
        if failed:
            self._consecutive_failures += 1
            self._streak[tenant] += 1
        else:
            self._consecutive_failures = 0
            self._streak.clear()
        self._prune(now)

    def stall_window_s(self, request_timeout_s: float | None = None) -> float:
        """Seconds without token progress that count as a stall: ``stall_s``, capped at
        ``stall_timeout_fraction`` x ``request_timeout_s`` when a request timeout is given."""
        if request_timeout_s is None:
            return self.tuning.stall_s
        return min(self.tuning.stall_s, self.tuning.stall_timeout_fraction * request_timeout_s)

    def check_stall(self, in_flight: int, progress_ref_s: float, request_timeout_s: float | None = None) -> None:
        """Trip when ``in_flight`` requests have seen no token progress since ``progress_ref_s`` for
        the stall window (:meth:`stall_window_s` of ``request_timeout_s``, seconds). Half-open, the
        window starts no earlier than the first probe: requests stuck since before the trip (they
        end only at their request timeout) must not fail a probe that has had no time to progress."""
        if not self.spec.enabled or in_flight <= 0:
            return
        window = self.stall_window_s(request_timeout_s)
        state = self.state
        if state is BreakerState.HALF_OPEN and self._first_probe_s is not None:
            progress_ref_s = max(progress_ref_s, self._first_probe_s)
        if self._clock() - progress_ref_s < window:
            return
        if state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and self._probes_out > 0):
            self._open(f"no token progress for {window:g} s with {in_flight} in flight")

    def _learn_ttft(self, ttft_s: float, limit: float | None, work_tokens: int) -> None:
        if limit is not None:  # a calibrated bucket: the sample is judged
            fast_alpha = 2.0 / (self.spec.min_samples + 1)
            recent = 1.0 / self.spec.latency_multiplier if self._recent is None else self._recent
            self._recent = recent + fast_alpha * (ttft_s / limit - recent)  # starts from a healthy replica's
            self._last_judged = (ttft_s, limit, work_tokens)
            if ttft_s > limit:
                return  # degraded samples never teach the baseline what "healthy" is
        if self._state is not BreakerState.CLOSED:
            return
        bucket = self._bucket(work_tokens)
        baseline, samples = self._baselines.get(bucket, (ttft_s, 0))
        samples += 1
        slow_alpha = max(2.0 / (10 * self.spec.min_samples + 1), 1.0 / samples)
        self._baselines[bucket] = (baseline + slow_alpha * (ttft_s - baseline), samples)

    def _prune(self, now: float) -> None:
        horizon = now - self.spec.window_seconds
        while self._window and self._window[0][0] < horizon:
            _, failed, tenant = self._window.popleft()
            self._failed_in_window -= failed
            self._tally.remove(tenant, failed)

    def _check_trip(self) -> None:
        decisive, failed, in_a_row = len(self._window), self._failed_in_window, self._consecutive_failures
        suspect = self._tally.suspect()
        if suspect is not None:  # leave out the one tenant whose failures others' successes contradict
            decisive -= self._tally.failed[suspect] + self._tally.ok[suspect]
            failed -= self._tally.failed[suspect]
            in_a_row -= self._streak[suspect]
        if in_a_row >= self.tuning.consecutive_failures:
            self._open(f"{in_a_row} upstream failures in a row{_among(self._streak, suspect)}")
        elif decisive >= self.spec.min_samples and failed / decisive > self.spec.error_ratio:
            self._open(
                f"{failed}/{decisive} upstream failures in {self.spec.window_seconds:g} s"
                f"{_among(self._tally.failed, suspect)}"
            )
        else:
            self._check_latency()

    def _check_latency(self) -> None:
        if self._recent is not None and self._recent > 1.0:
            ttft, limit, work = self._last_judged
            self._open(
                f"TTFT {self._recent:.2f}x its limit on average (last: {ttft:.3f} s over {limit:.3f} s, "
                f"{self.spec.latency_multiplier:g}x the baseline of {work} tokens of prefill work)"
            )

    def _decide_half_open(self) -> None:
        needed = self.spec.half_open_requests
        decided = self._probe_ok + self._probe_failed
        allowed_failures = needed - needed * self.spec.half_open_success_ratio
        if self._probe_failed > allowed_failures + 1e-9:
            self._open(f"{self._probe_failed}/{decided} half-open probes failed")
        elif decided >= needed:
            self._close(f"{self._probe_ok}/{decided} half-open probes succeeded")

    def _open(self, reason: str) -> None:
        old = self._state
        self.trips += 1
        cooldown = min(self.spec.cooldown_seconds * 2 ** (self.trips - 1), self.spec.max_cooldown_seconds)
        self._state = BreakerState.OPEN
        self.open_until_s = self._clock() + cooldown
        self.epoch += 1
        self.last_trip_reason = reason
        self._probes_out = self._probe_ok = self._probe_failed = 0
        self._report(old, f"{reason}; open for {cooldown:g} s (trip {self.trips} in a row)")

    def _close(self, reason: str) -> None:
        old = self._state
        self._state = BreakerState.CLOSED
        self.trips = 0
        self.epoch += 1
        self._window.clear()
        self._tally.clear()
        self._streak.clear()
        self._failed_in_window = self._consecutive_failures = 0
        self._recent = None
        self._report(old, reason)

    def _report(self, old: BreakerState, reason: str) -> None:
        if self._on_transition is not None:
            self._on_transition(old, self._state, reason)
