"""Circuit breaker on backend degradation: closed -> open -> half-open -> closed (or open again).

Trips (only while closed) on:

- **latency**: a fast moving average of TTFT above ``latencyMultiplier`` x the calibrated
  baseline (a slow moving average of healthy TTFTs, trusted after ``minSamples`` responses;
  never below :attr:`BreakerTuning.latency_floor_s`, so microsecond jitter on an idle
  server cannot trip it). **Streamed responses only**: a non-streamed answer has no TTFT (its
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

Upstream 429 is *neutral* (the backend protecting itself is not degradation) and ``/health`` is
never consulted. Open: every request is refused (``circuit_open``) until the cooldown ends;
cooldowns double on each re-open, ``cooldownSeconds`` -> x2 -> ... capped at
``maxCooldownSeconds`` (60 -> 120 -> 240 -> 300 s by default), and reset once it closes.
Half-open: every other arrival is let through as a probe until ``halfOpenRequests`` probes have a
decisive outcome; it closes when the success share reaches ``halfOpenSuccessRatio`` and reopens
as soon as that share is out of reach. A probe whose outcome is neutral or cancelled frees its
slot for another probe, so the breaker can never lock itself out; outcomes of probes from an
earlier half-open period (``epoch``) are ignored as probes.

Pure: injected clock, no I/O.
"""

from collections import deque
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
    consecutive_failures: int = 5
    """Failures in a row that trip the breaker regardless of the window's ratio."""


class Breaker:
    """The circuit breaker of one replica. All times are seconds from ``clock``."""

    def __init__(self, spec: CircuitBreakerSpec, tuning: BreakerTuning, clock: Callable[[], float]) -> None:
        self.spec, self.tuning, self._clock = spec, tuning, clock
        self._state = BreakerState.CLOSED
        self.epoch = 0
        self.trips = 0  # consecutive opens without a close; sets the cooldown
        self.open_until_s = 0.0
        self.last_trip_reason = ""
        self._window: deque[tuple[float, bool]] = deque()  # (time, failed) of decisive outcomes
        self._failed_in_window = 0
        self._consecutive_failures = 0
        self._baseline_s: float | None = None
        self._recent_s: float | None = None
        self._ttft_samples = 0
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
        return self._state

    @property
    def baseline_ttft_s(self) -> float | None:
        """Calibrated healthy TTFT (None until ``minSamples`` responses were seen)."""
        return self._baseline_s if self._ttft_samples >= self.spec.min_samples else None

    def latency_limit_s(self) -> float | None:
        """TTFT above which a response counts as degraded (None while uncalibrated)."""
        baseline = self.baseline_ttft_s
        if baseline is None:
            return None
        return self.spec.latency_multiplier * max(baseline, self.tuning.latency_floor_s)

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

    def record(self, outcome: Completion, ttft_s: float | None = None, probe_epoch: int | None = None) -> None:
        """One admitted request ended with ``outcome``; ``ttft_s`` when a first token was seen."""
        limit = self.latency_limit_s()
        slow = ttft_s is not None and limit is not None and ttft_s > limit
        if probe_epoch is not None and probe_epoch == self.epoch and self.state is BreakerState.HALF_OPEN:
            self._probes_out = max(0, self._probes_out - 1)
            if outcome is Completion.FAILURE or (outcome is Completion.SUCCESS and slow):
                self._probe_failed += 1
            elif outcome is Completion.SUCCESS:
                self._probe_ok += 1
            self._decide_half_open()
            return
        if outcome in (Completion.NEUTRAL, Completion.CANCELLED):
            return
        now = self._clock()
        failed = outcome is Completion.FAILURE
        self._window.append((now, failed))
        self._failed_in_window += failed
        self._consecutive_failures = self._consecutive_failures + 1 if failed else 0
        self._prune(now)
        if ttft_s is not None and not failed:
            self._learn_ttft(ttft_s, slow)
        if self._state is BreakerState.CLOSED and self.spec.enabled:
            self._check_trip()

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

    def _learn_ttft(self, ttft_s: float, slow: bool) -> None:
        fast_alpha = 2.0 / (self.spec.min_samples + 1)
        self._recent_s = ttft_s if self._recent_s is None else self._recent_s + fast_alpha * (ttft_s - self._recent_s)
        if slow or self._state is not BreakerState.CLOSED:
            return  # degraded samples never teach the baseline what "healthy" is
        self._ttft_samples += 1
        slow_alpha = max(2.0 / (10 * self.spec.min_samples + 1), 1.0 / self._ttft_samples)
        self._baseline_s = (
            ttft_s if self._baseline_s is None else self._baseline_s + slow_alpha * (ttft_s - self._baseline_s)
        )

    def _prune(self, now: float) -> None:
        horizon = now - self.spec.window_seconds
        while self._window and self._window[0][0] < horizon:
            _, failed = self._window.popleft()
            self._failed_in_window -= failed

    def _check_trip(self) -> None:
        decisive = len(self._window)
        if self._consecutive_failures >= self.tuning.consecutive_failures:
            self._open(f"{self._consecutive_failures} upstream failures in a row")
        elif decisive >= self.spec.min_samples and self._failed_in_window / decisive > self.spec.error_ratio:
            self._open(f"{self._failed_in_window}/{decisive} upstream failures in {self.spec.window_seconds:g} s")
        else:
            limit = self.latency_limit_s()
            if limit is not None and self._recent_s is not None and self._recent_s > limit:
                self._open(
                    f"TTFT {self._recent_s:.3f} s over {limit:.3f} s ({self.spec.latency_multiplier:g}x baseline)"
                )

    def _decide_half_open(self) -> None:
        needed = self.spec.half_open_requests
        decided = self._probe_ok + self._probe_failed
        allowed_failures = needed - needed * self.spec.half_open_success_ratio
        if self._probe_failed > allowed_failures + 1e-9:
            self._open(f"{self._probe_failed}/{decided} half-open probes failed")
        elif decided >= needed:
            self._close()

    def _open(self, reason: str) -> None:
        self.trips += 1
        cooldown = min(self.spec.cooldown_seconds * 2 ** (self.trips - 1), self.spec.max_cooldown_seconds)
        self._state = BreakerState.OPEN
        self.open_until_s = self._clock() + cooldown
        self.epoch += 1
        self.last_trip_reason = reason
        self._probes_out = self._probe_ok = self._probe_failed = 0

    def _close(self) -> None:
        self._state = BreakerState.CLOSED
        self.trips = 0
        self.epoch += 1
        self._window.clear()
        self._failed_in_window = self._consecutive_failures = 0
        self._recent_s = self._baseline_s
