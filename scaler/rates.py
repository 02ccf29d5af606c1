"""From sidecar snapshots to one :class:`~tidegate.scaler.law.Observation`: counter deltas and rates.

The pods whose stats count are those in the Service (:attr:`~tidegate.scaler.pods.PodInfo.in_service`):
the active ones, and the warm ones labelled ``tidegate.dev/serving`` (``spec.warmPool.serve``) once
Ready. A serving warm pod's load counts like an active pod's (and so does its silence: missing
stats hold the pool), but it is not an active replica: the law sizes the active replicas for the load
of every serving pod, and the warm ones stay on top as headroom.

Pure (no I/O, no clock of its own). The sidecars' ``*_total`` fields are monotonic counters
since the sidecar process started (``admission.stats``); this module turns two snapshots of
one pod (kept as compact :class:`Sample` s) into a :class:`PodDelta`, robust to:

- **counter resets**: a new ``instance_id`` (or any counter going down) means the sidecar
  restarted; its counters started from zero at ``started_at_s``, so the delta is the new
  totals over ``time_s - started_at_s``;
- **pods coming**: a pod seen for the first time that started within ``max_window_s`` is
  counted from its start in the same way; an older one waits for a second sample;
- **pods going**: a pod no longer listed is simply not counted (its last rejections were
  already in earlier windows); its samples are dropped once it has been out of the pod list for
  ``keep_s`` (:meth:`SampleHistory.prune`), so a pod that drops out of a watch and comes back, or
  restarts under the same name, still finds its baseline and its counter reset is still seen.

:class:`SampleHistory` keeps, per pod, the samples of the last ``keep_s`` seconds, so a
rate always covers about ``window_s`` of the *sidecar's* clock whoever polls and however often:
two scaler replicas polling the same pods get the same rates (see :mod:`tidegate.scaler.service`).
"""

import collections
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from tidegate.admission.stats import StatsSnapshot
from tidegate.scaler.law import Observation
from tidegate.scaler.pods import PodInfo


class Sample(NamedTuple):
    """The part of one :class:`StatsSnapshot` the scaler keeps: a handful of numbers per pod.

    ``tenant_capacity`` lists only tenants with capacity rejections (usually none), so keeping
    thousands of samples costs little memory and little garbage-collector work.
    """

    time_s: float
    started_at_s: float
    instance_id: str
    admitted: int
    capacity_rejected: int
    policy_rejected: int
    in_flight_tokens: int
    token_budget: int | None  # None: still being read from the model server (unknown, not 0)
    queue_depth: int
    tenant_capacity: Mapping[str, int]

    @classmethod
    def of(cls, s: StatsSnapshot) -> "Sample":
        return cls(
            s.time_s,
            s.started_at_s,
            s.instance_id,
            s.admitted_total,
            s.capacity_rejected_total,
            s.policy_rejected_total,
            s.in_flight_tokens,
            s.token_budget,
            s.queue_depth,
            {name: t.capacity_rejected for name, t in s.tenants.items() if t.capacity_rejected > 0},
        )


@dataclass(frozen=True)
class PodDelta:
    """Counts of one pod over ``window_s`` seconds (its own clock); ``reset``: counted from its start."""

    window_s: float
    admitted: int
    capacity_rejected: int
    policy_rejected: int
    capacity_rejected_tenants: frozenset[str]
    reset: bool = False


def _from_start(cur: Sample, max_window_s: float) -> PodDelta | None:
    window = cur.time_s - cur.started_at_s
    if not 0 < window <= max_window_s:
        return None
    tenants = frozenset(cur.tenant_capacity)
    return PodDelta(window, cur.admitted, cur.capacity_rejected, cur.policy_rejected, tenants, reset=True)


def _decided(delta: PodDelta | None) -> bool:
    """Whether the pod decided any request in its window (admitted or refused)."""
    return delta is not None and bool(delta.admitted or delta.capacity_rejected or delta.policy_rejected)


def pod_delta(prev: Sample | None, cur: Sample, max_window_s: float) -> PodDelta | None:
    """Counts between ``prev`` and ``cur`` of one pod; None when there is no usable baseline.

    ``max_window_s`` bounds how far back a pod's start may be used as a zero baseline.
    """
    if prev is not None and prev.instance_id == cur.instance_id:
        if cur.time_s <= prev.time_s:
            return None
        before = (prev.admitted, prev.capacity_rejected, prev.policy_rejected)
        after = (cur.admitted, cur.capacity_rejected, cur.policy_rejected)
        # a counter that went down without a new instance_id is a reset too (falls through)
        if all(a >= b for a, b in zip(after, before, strict=True)):
            tenants = frozenset(
                name for name, n in cur.tenant_capacity.items() if n > prev.tenant_capacity.get(name, 0)
            )
            return PodDelta(
                cur.time_s - prev.time_s,
                after[0] - before[0],
                after[1] - before[1],
                after[2] - before[2],
                tenants,
            )
    return _from_start(cur, max_window_s)


class SampleHistory:
    """Per-pod ring of recent :class:`Sample` s of one pool, and the baseline for a window.

    Keyed by the pod's name as the pod source lists it. ``record(pod, sample)`` stores one;
    ``baseline(pod, cur, window_s)`` returns the newest stored sample of the same pod taken at
    least ``window_s`` before ``cur`` (or the oldest one, if none is that old; never one more than
    ``keep_s`` older than ``cur``). Samples closer than
    ``min_spacing_s`` to the last one kept are not kept, and samples older than ``keep_s`` (sidecar
    clock) are dropped, so a pod holds at most ``keep_s / min_spacing_s`` samples however often the
    scaler is asked; :meth:`prune` drops the pods that left the pod list ``keep_s`` ago, so memory
    follows the pods that exist, not every pod the pool ever had.
    """

    def __init__(self, keep_s: float, min_spacing_s: float = 0.0) -> None:
        self.keep_s = keep_s
        self.min_spacing_s = min_spacing_s
        self._by_pod: dict[str, collections.deque[Sample]] = {}
        self._listed_s: dict[str, float] = {}

    def baseline(self, pod: str, cur: Sample, window_s: float) -> Sample | None:
        ring = self._by_pod.get(pod)
        if not ring:
            return None
        # a sample more than keep_s old is no baseline, whether or not it was pruned yet
        older = [s for s in ring if cur.time_s - self.keep_s <= s.time_s < cur.time_s]
        if not older:
            return None
        cutoff = cur.time_s - window_s
        at_or_before = [s for s in older if s.time_s <= cutoff]
        return at_or_before[-1] if at_or_before else older[0]

    def record(self, pod: str, snap: Sample) -> None:
        ring = self._by_pod.setdefault(pod, collections.deque())
        if ring and snap.time_s - ring[-1].time_s < max(self.min_spacing_s, 1e-9):
            return  # the same document again, or too soon after the last one kept
        ring.append(snap)
        while ring and ring[0].time_s < snap.time_s - self.keep_s:
            ring.popleft()

    def prune(self, listed: Iterable[str], now_s: float) -> None:
        """Note that the pods ``listed`` exist at ``now_s`` (the caller's clock, seconds; every pod
        of the pool, whatever its role), and drop every pod not listed for more than ``keep_s``.

        The caller's clock, not the samples' (a sidecar whose clock runs far ahead would otherwise
        never look old enough to forget).
        """
        for name in listed:
            if name in self._by_pod:
                self._listed_s[name] = now_s
        for name in self._by_pod:
            self._listed_s.setdefault(name, now_s)  # recorded but not listed yet: counts from now
        for name in [n for n, t in self._listed_s.items() if t < now_s - self.keep_s]:
            del self._listed_s[name]
            del self._by_pod[name]

    @property
    def pods(self) -> int:
        """Pods with samples kept."""
        return len(self._by_pod)

    def __len__(self) -> int:
        return sum(len(r) for r in self._by_pod.values())


def loading(pods: Iterable[PodInfo], warm_pool_size: int | None) -> int:
    """Replicas on their way to serving: pods not Ready yet, beyond the pool's warm pool.

    The operator labels every new pod ``warm`` and promotes it to ``active`` once Ready, and keeps
    ``spec.replicas + warmPool.size`` pods (plus draining ones): so while ``spec.replicas`` is above
    the active count, the warm-labelled pods beyond ``warm_pool_size`` are loading to serve, not
    refilling the warm pool. A pool at 1 whose only replica is loading has no active pod yet,
    and must not look idle to KEDA. ``warm_pool_size`` None (unknown): 0.
    """
    if warm_pool_size is None:
        return 0
    warm = [p for p in pods if p.warm]
    return min(sum(1 for p in warm if not p.ready), max(0, len(warm) - warm_pool_size))


def observe(
    pods: Iterable[PodInfo],
    current: Mapping[str, Sample],
    baselines: Mapping[str, Sample | None],
    now_s: float,
    stale_after_s: float,
    max_window_s: float,
    warm_pool_size: int | None = None,
    window_s: float | None = None,
) -> Observation:
    """Sum one poll of a pool into an :class:`Observation`.

    ``pods``: the pool's pods (from a pod source); ``current``: the :class:`Sample` of the stats each
    pod answered with (keyed by pod name; absent = no answer); ``baselines``: each pod's earlier
    sample (or None). ``now_s``: wall-clock Unix seconds (samples carry the sidecar's wall clock); one older
    than ``stale_after_s`` counts as missing. The pods in the Service contribute their stats: the
    ``active`` ones, and the Ready ``warm`` ones labelled serving; every Ready warm pod counts as
    promotable (``warm``); stats of other pods are ignored. A serving warm pod counts (its load, its
    budget, as a replica of the rates, and in ``warm_serving``) once it took requests in the window
    (decided some, or holds tokens or a queue): one labelled serving that the Service does not route to
    (endpoints not updated yet, a Service still selecting ``role=active`` during an operator upgrade)
    carries no share of the pool's load. Counted, it would let the law take its share of the need off
    the active replicas, and thin what one replica admits (the knee ``c``) by a replica that admits
    nothing. A Ready pod in the Service without fresh stats is *stale* (the law will not scale down:
    part of the load is unseen); a not-ready active one is *starting*; a not-ready warm one takes no
    requests yet and :func:`loading` counts it if it is on its way to serve.

    ``window_s`` (the rate window, seconds; None: each pod's rate counts in full, as before): the
    pool's rates are the counts of the last ``W = min(window_s, longest pod window)`` over ``W``. A pod
    whose counts cover less (it joined, or its sidecar restarted, within the window) adds what it
    counted over ``W``, not over its own shorter time, and counts as that share of a replica in
    ``reporting_share``. Summing each pod's own rate instead counts the requests a new replica took
    twice: once at its rate, once in the older replicas' rates, which still cover the time before
    it took its share (simulator, spike seed 0: 15 req/s arriving read as 18.8/s the poll a fourth
    replica joined, and bought a sixth).
    """
    pods = list(pods)
    active = starting = warm = warm_serving = reporting = fresh = 0
    stale: list[str] = []
    deltas: list[PodDelta] = []
    tenants: set[str] = set()
    in_flight = budget = queue = 0
    for pod in pods:
        if pod.warm and pod.ready:
            warm += 1
        if pod.active:
            active += 1
        elif not pod.load_counts:
            continue
        snap = current.get(pod.name)
        # A clock that is not finite, or off by more than the staleness bound either way, is no
        # evidence of anything: such a pod counts as missing (never as idle).
        if snap is None or not math.isfinite(snap.time_s) or abs(now_s - snap.time_s) > stale_after_s:
            if pod.ready:
                stale.append(pod.name)
            else:
                starting += 1
            continue
        baseline = baselines.get(pod.name)
        delta = pod_delta(baseline, snap, max_window_s)
        took = snap.in_flight_tokens or snap.queue_depth or _decided(delta)
        if pod.warm and not took and (delta is not None or baseline is None):
            continue  # labelled serving, but the Service sends it nothing: no share of the load, no replica of it
        if not pod.ready:
            starting += 1
        in_flight += snap.in_flight_tokens
        if snap.token_budget is not None:  # a replica still sizing itself holds an unknown budget, not 0
            fresh += 1
            budget += snap.token_budget
        queue += snap.queue_depth
        if delta is None:
            if baseline is not None and pod.ready:
                stale.append(pod.name)  # it answered before, but its counters give no usable rate now
            continue
        reporting += 1
        warm_serving += pod.warm
        deltas.append(delta)
        tenants |= delta.capacity_rejected_tenants
    windows = [d.window_s for d in deltas]
    pool_window = min(window_s, max(windows)) if window_s is not None and windows else None
    # each pod's share of the pool's window (1: it covers all of it); its counts weigh share / its window
    shares = [1.0 if pool_window is None else min(1.0, d.window_s / pool_window) for d in deltas]
    weights = [s / d.window_s for d, s in zip(deltas, shares, strict=True)]
    admitted = sum(d.admitted * w for d, w in zip(deltas, weights, strict=True))
    cap = sum(d.capacity_rejected * w for d, w in zip(deltas, weights, strict=True))
    pol = sum(d.policy_rejected * w for d, w in zip(deltas, weights, strict=True))
    return Observation(
        active=active,
        starting=starting,
        loading=loading(pods, warm_pool_size),
        warm=warm,
        warm_serving=warm_serving,
        reporting=reporting,
        reporting_share=sum(shares) if pool_window is not None else None,
        stale=tuple(sorted(stale)),
        window_s=sum(windows) / len(windows) if windows else 0.0,
        admitted_per_s=admitted,
        capacity_rejected_per_s=cap,
        policy_rejected_per_s=pol,
        capacity_rejected_tenants=len(tenants),
        in_flight_tokens=in_flight,
        token_budget=budget,
        fresh=fresh,
        queue_depth=queue,
    )
