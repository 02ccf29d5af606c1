"""The scaler's core service: one decision per pool per refresh, shared by every RPC.

``Scaler.decide(target)`` reads the pool's signal (a :class:`SignalSource`), applies the law
and remembers the law's state per pool. Calls for the same pool within ``min_refresh_s`` share
one scrape (KEDA calls GetMetrics then IsActive back to back, and the HPA polls too), and
concurrent calls for one pool wait for the same scrape instead of starting another.

**Two or more replicas behind one Service.** Nothing here needs to be shared between replicas:

- the tunables come from the trigger metadata in every call (no replica-local config);
- rates are counter deltas over ``windowSeconds`` of the *sidecars'* clock, taken from each
  replica's own ring of recent snapshots; two replicas scraping the same pods compute rates
  over (nearly) the same window whoever KEDA asked, so they agree on saturation and size;
- the scale-down cooldown is the law's stabilisation window, and a replica that has not watched
  a pool for a whole cooldown never scales it down (it holds). So a restarted or freshly added
  replica can only be *more* conservative than one that has been running, never less;
- missing data holds rather than guesses.

What can differ: during the first ``windowSeconds`` after a replica starts it holds
(HOLD_WARMUP) while the other may already move; and the ``COOLDOWN`` hold can end up to one poll
apart. Both err on the side of keeping capacity.

**Memory follows the pools in use.** A pool KEDA has not asked about for
``max(forget_after_min_s, forget_after_windows x windowSeconds)`` (10 minutes by default; KEDA
asks every polling interval and every HPA sync, ~15-30 s) is forgotten: its law state, its last
decision, what its signal source keeps (samples, pod watch, Prometheus client) and what the
``forget_hooks`` keep (its metric series, its ``/decisions`` entry). Asked about again, it starts as
a fresh scaler replica would: it holds its current count until it has a rate, and it cannot scale
down before it has watched a whole cooldown.
"""

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tidegate.scaler import law
from tidegate.scaler.errors import SourceError
from tidegate.scaler.law import Decision, LawState, Observation, Policy
from tidegate.scaler.metadata import Target

log = logging.getLogger("tidegate.scaler")

# A decision the same as the last one said at INFO (desired count and reason) is logged at DEBUG,
# except once per this many seconds per pool, so a quiet pool still shows the scaler is deciding.
LOG_HEARTBEAT_S = 600.0


def log_level(said: tuple[int, str] | None, said_at_s: float, desired: int, reason: str, now_s: float) -> int:
    """The level of one decision's log line (pure): INFO when the desired count or the reason differs
    from the last line logged at INFO (``said``, at ``said_at_s``), or that was ``LOG_HEARTBEAT_S`` ago;
    DEBUG otherwise. KEDA asks every few seconds, so a steady pool would otherwise log ~4 lines a minute."""
    if said != (desired, reason) or now_s - said_at_s >= LOG_HEARTBEAT_S:
        return logging.INFO
    return logging.DEBUG


class SignalSource(Protocol):
    """Where a pool's observation comes from (``sidecar.SidecarSignals``; a Prometheus one)."""

    async def observe(self, target: Target) -> Observation:
        """One observation of the pool; raises :class:`~tidegate.scaler.errors.SourceError` if unreadable."""
        ...

    def forget(self, key: tuple[str, str]) -> None:
        """Drop what is kept for pool ``key`` (``(namespace, pool)``); the next observe starts afresh."""
        ...

    async def close(self) -> None: ...


DecisionHook = Callable[[Target, Decision], None]
ForgetHook = Callable[[tuple[str, str]], None]


class BySource:
    """Routes each pool to the signal source its ``spec.scaling.signal.source`` names.

    ``sources``: ``{"sidecar": SidecarSignals, "prometheus": PrometheusSignals}``; a pool naming a
    source this scaler was not given raises :class:`~tidegate.scaler.errors.SourceError`.
    """

    def __init__(self, sources: dict[str, SignalSource]) -> None:
        self.sources = sources

    async def observe(self, target: Target) -> Observation:
        name = target.scaling.signal.source.value
        source = self.sources.get(name)
        if source is None:
            raise SourceError(f"pool {target.namespace}/{target.pool}: signal source {name!r} is not enabled here")
        return await source.observe(target)

    def forget(self, key: tuple[str, str]) -> None:
        for source in self.sources.values():
            source.forget(key)

    async def close(self) -> None:
        for source in self.sources.values():
            await source.close()


@dataclass
class _Pool:
    asked_s: float
    forget_after_s: float
    state: LawState = field(default_factory=LawState)
    decision: Decision | None = None
    decided_at_s: float = float("-inf")
    said: tuple[int, str] | None = None  # (desired, reason) of the last decision logged at INFO
    said_at_s: float = float("-inf")
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Scaler:
    """Decisions per pool. ``clock``: monotonic seconds (injectable); ``hooks`` see every new decision;
    ``forget_hooks`` are called with ``(namespace, pool)`` when an idle pool is forgotten (module
    docstring: ``forget_after_min_s``, ``forget_after_windows``)."""

    def __init__(
        self,
        signals: SignalSource,
        min_refresh_s: float = 5.0,
        hpa_tolerance: float = law.HPA_TOLERANCE,
        clock: Callable[[], float] = time.monotonic,
        hooks: tuple[DecisionHook, ...] = (),
        forget_hooks: tuple[ForgetHook, ...] = (),
        forget_after_min_s: float = 600.0,
        forget_after_windows: float = 10.0,
    ) -> None:
        self.signals = signals
        self.min_refresh_s = min_refresh_s
        self.hpa_tolerance = hpa_tolerance
        self.forget_after_min_s = forget_after_min_s
        self.forget_after_windows = forget_after_windows
        self._clock = clock
        self._hooks = hooks
        self._forget_hooks = forget_hooks
        self._pools: dict[tuple[str, str], _Pool] = {}
        self._swept_s = float("-inf")

    @property
    def pools(self) -> int:
        """Pools remembered now."""
        return len(self._pools)

    async def decide(self, target: Target) -> Decision:
        """The pool's current decision (fresh within ``min_refresh_s``).

        Raises :class:`~tidegate.scaler.errors.SourceError` when the signal cannot be read at all.
        """
        now = self._clock()
        if now - self._swept_s >= 10.0:  # a sweep costs O(pools): not on every call
            self.forget_idle()
        forget_after = max(self.forget_after_min_s, self.forget_after_windows * target.scaling.signal.window_seconds)
        pool = self._pools.get(target.key)
        if pool is None:
            pool = self._pools[target.key] = _Pool(asked_s=now, forget_after_s=forget_after)
        pool.asked_s, pool.forget_after_s = now, forget_after
        async with pool.lock:
            now = self._clock()
            if pool.decision is not None and now - pool.decided_at_s < self.min_refresh_s:
                return pool.decision
            observation = await self.signals.observe(target)
            now = self._clock()
            policy = Policy.from_spec(target.scaling, hpa_tolerance=self.hpa_tolerance)
            decision, pool.state = law.decide(policy, observation, pool.state, now)
            pool.decision, pool.decided_at_s = decision, now
        self._explain(target, observation, decision, pool, now)
        return decision

    def forget_idle(self) -> list[tuple[str, str]]:
        """Forget the pools not asked about for their forget time (module docstring); returns their keys.

        :meth:`decide` calls it at most every 10 s; a pool being decided right now is never forgotten.
        """
        now = self._clock()
        self._swept_s = now
        idle = [k for k, p in self._pools.items() if now - p.asked_s > p.forget_after_s and not p.lock.locked()]
        for key in idle:
            del self._pools[key]
            self.signals.forget(key)
            for hook in self._forget_hooks:
                hook(key)
            log.info(json.dumps({"event": "pool_forgotten", "namespace": key[0], "pool": key[1]}))
        return idle

    def _explain(self, target: Target, obs: Observation, d: Decision, pool: _Pool, now: float) -> None:
        level = log_level(pool.said, pool.said_at_s, d.desired, d.reason.value, now)
        if level == logging.INFO:
            pool.said, pool.said_at_s = (d.desired, d.reason.value), now
        record = {
            "event": "scaling_decision",
            "namespace": target.namespace,
            "pool": target.pool,
            "current": d.current,
            "desired": d.desired,
            "metric_value": d.metric_value,
            "reason": d.reason.value,
            "active": d.active,
            "capacity_reject_rate": d.capacity_reject_rate,
            "policy_reject_rate": d.policy_reject_rate,
            "utilization": d.utilization,
            "reporting_pods": obs.reporting,
            "stale_pods": list(obs.stale),
            "text": d.text,
        }
        if log.isEnabledFor(level):
            log.log(level, json.dumps(record, separators=(",", ":")))
        for hook in self._hooks:
            hook(target, d)

    async def close(self) -> None:
        await self.signals.close()
