"""The system gate: backend KV-cache usage and GPU memory, each with trip/resume hysteresis.

A signal blocks new requests once its value reaches ``trip`` and keeps blocking until it falls
below ``resume`` (both 0..1). What a signal means when it cannot be trusted:

========================  ==============================================================
situation                 behaviour
========================  ==============================================================
never observed            not pressure (fail-open): no GPU visible, or an engine whose
                          metrics carry no KV gauge (llama.cpp, TGI, ``openai``)
older than                ``telemetry.onStale``: ``failOpen`` ignores the signal (the
``staleAfterSeconds``     token budget still bounds load), ``failClosed`` refuses
                          (``kv_pressure`` / ``gpu_memory``) until fresh data arrives.
                          Unreachable ``/metrics`` and a KV gauge that is not a ratio
                          (NaN, Inf, < 0, > 1) both leave the last reading to age
KV gauge frozen while     not pressure, and the trip is cleared: vLLM refreshes its gauges
this sidecar has nothing  only on engine steps, so an idle server reports its last busy
in flight                 value forever (INTEROP.md). "Frozen" = unchanged for
                          ``frozen_after_s``. If the backend really is full from other
                          traffic, the gauge moves and trips the gate again.
========================  ==============================================================

Pure: values and times are passed in.
"""

from dataclasses import dataclass

from tidegate.api.admission import HysteresisGate, StalePolicy


@dataclass(slots=True)
class GateSignal:
    """One hysteresis signal (a ratio 0..1) and when it was last received and last changed."""

    value: float | None = None
    received_at_s: float = 0.0
    changed_at_s: float = 0.0
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
        if not spec.enabled or self.value is None:
            return False
        if now - self.received_at_s > stale_after_s:
            return on_stale is StalePolicy.FAIL_CLOSED
        if idle and frozen_after_s is not None and now - self.changed_at_s >= frozen_after_s:
            self.tripped = False
            return False
        return self.tripped
