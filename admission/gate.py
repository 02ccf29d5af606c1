"""The system gate and the backend queue: what the model server's own load signals decide.

Two kinds of signal, both read from the model server (:mod:`tidegate.admission.telemetry`):

- **hysteresis gates** (:class:`GateSignal`): KV-cache usage (vLLM) and GPU memory (NVML), ratios
  0..1. A signal blocks new requests once its value reaches ``trip`` and keeps blocking until it
  falls below ``resume``: new requests are refused (``kv_pressure`` / ``gpu_memory``) and queued
  ones wait;
- **the backend queue** (:class:`QueueSignal`): requests waiting in the model server's own queue
  (vLLM ``vllm:num_requests_waiting``, llama.cpp ``llamacpp:requests_deferred``, TGI
  ``tgi_queue_size``). While it holds more than ``backendQueue.maxQueued`` (default 0) the sidecar
  dispatches nothing new: arrivals wait in its own weighted-fair queue, where the usual deadlines
  refuse them (``queue_full``, ``queue_timeout``, ``slo_unreachable``, with ``Retry-After``)
  instead of piling into the engine's first-come-first-served queue, which knows no tenants and
  no priorities. Dispatch resumes when the engine's queue is back within the limit. This is the
  load signal of engines without a KV gauge (llama.cpp, TGI).

What a signal means when it cannot be trusted (both kinds):

========================  ==============================================================
situation                 behaviour
========================  ==============================================================
not read for this engine  not pressure: no GPU visible, an engine whose metrics carry no
                          such signal (no KV gauge on llama.cpp and TGI; nothing at all
                          on ``openai``)
older than                ``telemetry.onStale``: ``failOpen`` ignores the signal (the
``staleAfterSeconds``     token budget still bounds load), ``failClosed`` refuses
                          (``kv_pressure`` / ``gpu_memory``) or holds the queue until
                          fresh data arrives. Unreachable or undecodable ``/metrics``, a
                          metric missing from the page and a KV gauge that is not a ratio
                          (NaN, Inf, < 0, > 1) all leave the last reading to age. A signal
                          this engine serves but never read since it was expected counts
                          as read at that moment (so ``failClosed`` applies to a
                          ``/metrics`` that never worked, ``staleAfterSeconds`` after start)
unchanged while this      not pressure, and a KV trip is cleared: vLLM refreshes its
sidecar has nothing in    gauges only on engine steps (``vllm/v1/metrics/loggers.py``
flight                    ``PrometheusStatLogger.record``), so an idle server reports its
                          last busy value forever. "Frozen" = unchanged for
                          ``frozen_after_s``. If the backend really is busy with other
                          traffic, the value moves and trips the gate again.
========================  ==============================================================

Pure: values and times are passed in.
"""

from dataclasses import dataclass

from tidegate.api.admission import HysteresisGate, StalePolicy


@dataclass(slots=True)
class _Reading:
    """When a signal was last received and last changed, and since when it is expected."""

    received_at_s: float = 0.0
    changed_at_s: float = 0.0
    expected_since_s: float | None = None

    def expect(self, since_s: float | None) -> None:
        """This engine serves the signal (from ``since_s``), or not (``None``); an earlier start is kept."""
        if since_s is None:
            self.expected_since_s = None
        elif self.expected_since_s is None:
            self.expected_since_s = since_s

    def _stale_verdict(self, read: bool, now: float, stale_after_s: float, on_stale: StalePolicy) -> bool | None:
        """``on_stale``'s answer when the signal is stale (or expected and never read), else None."""
        if not read:
            if self.expected_since_s is None or now - self.expected_since_s <= stale_after_s:
                return False  # never read and not (yet) overdue: nothing to go on
            return on_stale is StalePolicy.FAIL_CLOSED
        if now - self.received_at_s > stale_after_s:
            return on_stale is StalePolicy.FAIL_CLOSED
        return None

    def _frozen(self, now: float, idle: bool, frozen_after_s: float | None) -> bool:
        return idle and frozen_after_s is not None and now - self.changed_at_s >= frozen_after_s


@dataclass(slots=True)
class GateSignal(_Reading):
    """One hysteresis signal (a ratio 0..1) and when it was last received and last changed."""

    value: float | None = None
    tripped: bool = False

    def observe(self, value: float, now: float, spec: HysteresisGate) -> None:
        """Record a fresh reading and move the hysteresis state."""
        if value != self.value:
            self.changed_at_s = now
        self.value, self.received_at_s = value, now
        self.tripped = value >= spec.resume if self.tripped else value >= spec.trip

    def age_s(self, now: float) -> float | None:
        """Seconds since the last reading (None if never read)."""
        return None if self.value is None else now - self.received_at_s

    def blocking(
        self,
        now: float,
        spec: HysteresisGate,
        *,
        stale_after_s: float,
        on_stale: StalePolicy,
        idle: bool = False,
        frozen_after_s: float | None = None,
    ) -> bool:
        """Whether this signal refuses new requests now (see the module table)."""
        if not spec.enabled:
            return False
        verdict = self._stale_verdict(self.value is not None, now, stale_after_s, on_stale)
        if verdict is not None:
            return verdict
        if self._frozen(now, idle, frozen_after_s):
            self.tripped = False
            return False
        return self.tripped


@dataclass(slots=True)
class QueueSignal(_Reading):
    """Requests waiting in the model server's own queue (a count), for holding dispatch."""

    value: int | None = None

    def observe(self, queued: int, now: float) -> None:
        """Record a fresh reading (requests queued in the engine, >= 0)."""
        if queued != self.value:
            self.changed_at_s = now
        self.value, self.received_at_s = queued, now

    def age_s(self, now: float) -> float | None:
        """Seconds since the last reading (None if never read)."""
        return None if self.value is None else now - self.received_at_s

    def holding(
        self,
        now: float,
        *,
        max_queued: int,
        stale_after_s: float,
        on_stale: StalePolicy,
        idle: bool = False,
        frozen_after_s: float | None = None,
    ) -> bool:
        """Whether the sidecar must hold new work back from the engine now (see the module table):
        more than ``max_queued`` requests wait in the engine's queue, by a fresh reading that is
        evidence (not frozen while this sidecar has nothing in flight)."""
        verdict = self._stale_verdict(self.value is not None, now, stale_after_s, on_stale)
        if verdict is not None:
            return verdict
        assert self.value is not None
        if self.value <= max_queued:
            return False
        return not self._frozen(now, idle, frozen_after_s)
