"""The scaling law: how many active replicas a pool needs, from what its sidecars decided.

Pure: no sockets, no Kubernetes, no clock of its own (``now_s`` is passed in), so the same
code runs in the scaler, in tests and in the simulator. Import contract: no kopf, aiohttp,
grpc or kubernetes (pyproject ``[[tool.importlinter.contracts]]``).

Inputs are one :class:`Observation` (per-second rates over a window, summed over the pool's
pods in the Service, plus gauges) and the :class:`Policy` (from ``spec.scaling``). The pods in the
Service are the active ones and, with ``spec.warmPool.serve``, the Ready warm ones: their load is
counted in full but only the active ones in ``N``, so the law sizes the active replicas for all of
it and the warm replicas stay on top, serving (:mod:`tidegate.scaler.rates`). Writing
``A`` admitted/s, ``C`` capacity-rejected/s, ``n`` pods in the Service with rates,
``t`` = ``targetUtilization``, ``r*`` = ``targetCapacityRejectRate``, ``h`` = :data:`HYSTERESIS`,
``L`` in-flight tokens, ``B`` mean token budget per replica, ``N`` current active replicas
(ready or still starting), ``c`` the highest per-replica admitted rate ``A / n`` the law has seen
*at the knee* in the last :data:`CAPACITY_MEMORY_S` (a window where the replicas were full: refusing
for capacity above ``r*``, or token utilisation above the band ``t(1+h)`` held for the sustain time below; none seen: no ``c``;
forgotten when the pool refuses above ``r*`` with no replica starting while ``ceil(D / (c * t)) <= N``,
since its replicas then no longer admit what they did, :func:`knee_contradicted`)::

    D        = A + C                       capacity demand; policy rejections never count
    rate     = C / D                       capacity reject rate (0 when D = 0)
    u        = L / (N * B)                 token utilisation of the current replicas
    util_rec = N                           if t(1-h) <= u <= t(1+h)    (dead band: no flapping)
             = N                           if u > t(1+h) for less than the sustain time (below)
             = ceil(L / (B * t))           otherwise
    raw      = max(ceil(D / (max(A / n, c) * t)), util_rec, N)   if rate > r*   (saturated; A ~ 0: maxReplicas)
             = minReplicas                                  else if idle (no demand, nothing in flight)
             = util_rec                                     otherwise
    need     = ceil(D / (c * t))           throughput need in replicas in the Service, once a knee has been
                                           seen; less the serving warm ones where that cannot flap (active_need)
    raw      = max(raw, min(need, N))      when raw < N and not idle: never below the throughput need

``L`` is a gauge read at one instant, and requests' token counts are heavy-tailed (a few long
prompts arriving together): one reading over the band is not yet load. A scale-up on utilisation
(and a knee from it) waits until ``u`` has stayed over ``t(1+h)`` for
:attr:`Policy.utilization_sustain_s` (half a polling interval: the next reading, whoever asks). In
the simulator's diurnal day one such reading at 104% bought a replica, and the knee it recorded
then held it for 35 minutes (seed 2: 4.67 GPU-h; 4.13 learning no knee from it; 4.07 with the wait).
Capacity refusals need no such wait: they are users being turned away.

``D / (A/n)`` is the demand in units of what one replica was observed to admit, so a
saturated pool is sized to run at ``t``; ``c`` stands in when it is higher, because what a
replica admits falls the longer it is overloaded (the adaptive budget cuts, a breaker opens):
sized by the current ``A / n`` alone, the simulator's spike asked for maxReplicas (16) and
peaked at 9-13 replicas, against 7-9 for the same attainment. The throughput need is the same measure remembered
from the last time replicas were full, in replicas *in the Service* (``c`` is ``A / n``, and ``n``
counts the serving warm replicas): the active replicas are held at it less the warm replicas'
share, as far as :func:`active_need` finds that safe. It only ever holds a scale-down: in-flight tokens grow
super-linearly with congestion (Little's law, ``L = lambda * W`` with ``W`` growing as the
replicas fill), so a pool that just scaled up sees ``L`` collapse and ``util_rec`` would take
it straight back down (1 -> 2 -> 1 ...) while the demand it served is unchanged; ``D`` and
``c`` are rates of requests, which do not depend on how congested the replicas are. Then,
clamped to ``[minReplicas, maxReplicas]``:

- up (``raw > N``): at most ``N + warm + maxScaleUpStep``; ready warm replicas are promoted in
  seconds and cost no new GPU, so they never use up the step;
- down (``raw < N``): only to the highest recommendation of the last
  ``scaleDownCooldownSeconds`` (the HPA's stabilisation window, applied here so a restarted
  or second scaler replica also waits: it must have watched a whole cooldown first), and never
  while any ready active pod's stats are missing or stale (hold, and say so).

The answer is reported to KEDA as an ``AverageValue`` metric with target 1, so the HPA computes
``ceil(metric)``; but the HPA ignores ratios ``metric / N`` within ``[1 - tolerance, 1 + tolerance]``
(0.1, bounds included), which would park a saturated pool of 10+ replicas one replica short forever. :func:`hpa_metric_value`
lifts such small scale-ups just past the tolerance (source: Kubernetes HPA algorithm,
https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details).
"""

import dataclasses
import math
from dataclasses import dataclass
from enum import StrEnum

from tidegate.api.scaling import ScalingSpec

HYSTERESIS = 0.15
"""Half-width of the utilisation dead band, relative to the target (0.15: 0.85 -> 0.72..0.98)."""
CAPACITY_MEMORY_S = 3600.0
"""How long a per-replica rate seen at the knee is remembered (the replica model rarely changes;
a new one is learnt at the next knee)."""
HPA_TOLERANCE = 0.1
"""The HPA's default ``--horizontal-pod-autoscaler-tolerance``."""


class Reason(StrEnum):
    """Why the law chose its answer (the ``reason`` label of ``tidegate_scaler_desired_replicas``)."""

    SATURATED = "saturated"  # capacity reject rate above target: sized from demand
    UTILIZATION = "utilization"  # token utilisation above the band: sized from in-flight tokens
    STEADY = "steady"  # within the band: no change
    COOLDOWN = "cooldown"  # lower demand, but not yet for a whole cooldown
    SCALE_DOWN = "scale_down"  # lower demand for a whole cooldown
    IDLE = "idle"  # no demand at all: towards minReplicas (after the cooldown)
    HOLD_STALE = "hold_stale"  # stats missing or stale: never scale down
    HOLD_WARMUP = "hold_warmup"  # no rate yet (first sample, or replicas still starting)
    BOUNDS = "bounds"  # moved only to respect minReplicas / maxReplicas


@dataclass(frozen=True)
class Policy:
    """The law's tunables; see :class:`tidegate.api.scaling.ScalingSpec` for meanings and units."""

    min_replicas: int = 1
    max_replicas: int = 8
    target_capacity_reject_rate: float = 0.02
    target_utilization: float = 0.85
    max_scale_up_step: int = 4
    scale_down_cooldown_s: float = 180.0
    utilization_sustain_s: float = 7.5
    hysteresis: float = HYSTERESIS
    hpa_tolerance: float = HPA_TOLERANCE

    @classmethod
    def from_spec(cls, spec: ScalingSpec, **overrides: float) -> "Policy":
        """The policy of an InferencePool's ``spec.scaling``."""
        return cls(
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            target_capacity_reject_rate=spec.target_capacity_reject_rate,
            target_utilization=spec.target_utilization,
            max_scale_up_step=spec.max_scale_up_step,
            scale_down_cooldown_s=float(spec.scale_down_cooldown_seconds),
            utilization_sustain_s=spec.polling_interval_seconds / 2,
            **overrides,
        )

    def clamp(self, n: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, n))


@dataclass(frozen=True)
class Observation:
    """What the pool's sidecars reported over one window (built by :mod:`tidegate.scaler.rates`).

    Counts of pods: ``active`` (role active, ready or not; the HPA's current replicas),
    ``starting`` (active, not ready yet), ``loading`` (not active yet, not ready, beyond the warm
    pool: replicas on their way to serve, :func:`tidegate.scaler.rates.loading`), ``warm`` (ready,
    promotable), ``warm_serving`` (those of the ``warm`` in the Service, ``spec.warmPool.serve``),
    ``reporting`` (pods in the Service -- active, or ready warm serving -- with fresh stats and a rate
    baseline), ``stale`` (names of ready pods in the Service whose stats are missing or too old).
    Rates are per second, summed over ``reporting`` pods; ``window_s`` is the mean window they cover
    (0: no pod has a baseline yet). ``reporting_share``: the same pods, each counted by the share of
    the rate window its counts cover (a pod that joined 10 s into a 60 s window: 1/6), the number of
    replicas the rates were earned by (None: ``reporting``; :func:`tidegate.scaler.rates.observe`).
    Gauges are summed over the pods in the Service with fresh stats;
    ``token_budget`` over the ``fresh`` ones among them whose budget is known (a replica still reading
    its capacity from the model server reports none: the per-replica budget is the mean of the known
    ones, never lowered by a 0).
    """

    active: int
    starting: int = 0
    loading: int = 0
    warm: int = 0
    warm_serving: int = 0
    reporting: int = 0
    reporting_share: float | None = None
    stale: tuple[str, ...] = ()
    window_s: float = 0.0
    admitted_per_s: float = 0.0
    capacity_rejected_per_s: float = 0.0
    policy_rejected_per_s: float = 0.0
    capacity_rejected_tenants: int = 0
    in_flight_tokens: int = 0
    token_budget: int = 0
    fresh: int = 0
    queue_depth: int = 0

    @property
    def rate_replicas(self) -> float:
        """``n`` of ``A / n``: the replicas the rates were earned by (``reporting_share``, else ``reporting``)."""
        return self.reporting if self.reporting_share is None else self.reporting_share

    @property
    def demand_per_s(self) -> float:
        return self.admitted_per_s + self.capacity_rejected_per_s

    @property
    def capacity_reject_rate(self) -> float:
        """Capacity rejections / capacity demand, 0..1 (0 without demand)."""
        return self.capacity_rejected_per_s / self.demand_per_s if self.demand_per_s > 0 else 0.0

    @property
    def policy_reject_rate(self) -> float:
        """Policy rejections / all requests, 0..1 (0 without requests)."""
        total = self.demand_per_s + self.policy_rejected_per_s
        return self.policy_rejected_per_s / total if total > 0 else 0.0

    @property
    def utilization(self) -> float | None:
        """In-flight tokens of every pod in the Service / (active replicas x budget per replica), 0..
        (above 1 when serving warm replicas carry load), or None without fresh budgets."""
        if self.fresh == 0 or self.token_budget == 0 or self.active == 0:
            return None
        return self.in_flight_tokens / (self.active * self.token_budget / self.fresh)


@dataclass(frozen=True)
class LawState:
    """What the law remembers between decisions for one pool: when it first looked, its
    recent raw recommendations ``(time_s, replicas)`` (kept for one cooldown), the per-replica
    admitted rates it saw at the knee ``(time_s, A / n)`` (kept for :data:`CAPACITY_MEMORY_S`), and
    since when token utilisation has been over the band (None: it is not)."""

    first_s: float | None = None
    recommendations: tuple[tuple[float, int], ...] = ()
    knees: tuple[tuple[float, float], ...] = ()
    over_band_since_s: float | None = None


@dataclass(frozen=True)
class Decision:
    """One answer: ``desired`` replicas (within bounds), why, and ``text`` for logs and Events.

    ``metric_value`` is what to report to KEDA (see :func:`hpa_metric_value`); ``active`` is the
    IsActive answer.
    """

    current: int
    desired: int
    reason: Reason
    text: str
    metric_value: float
    active: bool
    time_s: float
    capacity_reject_rate: float | None = None
    policy_reject_rate: float | None = None
    utilization: float | None = None


def hpa_metric_value(desired: int, current: int, tolerance: float = HPA_TOLERANCE) -> float:
    """The AverageValue metric (target 1) that makes the HPA move from ``current`` to ``desired``.

    The HPA does nothing while ``1 - tolerance <= metric / current <= 1 + tolerance``; a scale-up that small is
    reported as the smallest count past the tolerance instead (10 -> 11 becomes 12), because a
    saturated pool left where it is stays saturated. Scale-downs inside the tolerance are left
    alone: the HPA keeps the extra capacity, which is the safe side. Returns replicas (>= 0).
    """
    value = desired
    if current > 0 and desired > current:
        # the HPA's own test (replica_calculator.go, tolerances.isWithin), in the same float arithmetic
        while (1.0 - tolerance) <= (value * 1000) / (1000 * current) <= (1.0 + tolerance):
            value += 1
    return float(value)


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%" if x >= 0.01 or x == 0 else f"{x * 100:.1f}%"


def over_band(policy: Policy, obs: Observation) -> bool:
    """Token utilisation above the dead band, ``u > t(1+h)``."""
    u = obs.utilization
    return u is not None and u > policy.target_utilization * (1 + policy.hysteresis)


def _util_rec(policy: Policy, obs: Observation, sustained: bool = True) -> int:
    u = obs.utilization
    if u is None:
        return obs.active
    t, h = policy.target_utilization, policy.hysteresis
    if t * (1 - h) <= u <= t * (1 + h) or (u > t * (1 + h) and not sustained):
        return obs.active
    per_replica = obs.token_budget / obs.fresh
    return math.ceil(obs.in_flight_tokens / (per_replica * t))


def _count(replicas: float) -> int:
    """``ceil`` of a replica count, tolerant of float noise, and finite however small the rate it was
    divided by (a denormal admitted rate gives inf: counted as 10**9, clamped by maxReplicas later)."""
    return math.ceil(replicas - 1e-9) if replicas < 1e9 else 10**9


def knee_rate(policy: Policy, obs: Observation, sustained: bool = True) -> float | None:
    """Per-replica admitted/s ``A / n`` if this window shows the replicas full (refusing for
    capacity above the target, or token utilisation above the band and ``sustained``: see the
    module docstring), else None. Windows with replicas still starting say nothing about a
    replica's capacity."""
    if obs.reporting == 0 or obs.window_s <= 0 or obs.admitted_per_s <= 0 or obs.starting:
        return None
    full = obs.capacity_reject_rate > policy.target_capacity_reject_rate or (over_band(policy, obs) and sustained)
    return obs.admitted_per_s / obs.rate_replicas if full else None


def throughput_need(policy: Policy, obs: Observation, capacity: float | None) -> int | None:
    """``ceil(D / (c * t))``: the demand in replicas admitting ``capacity`` each at the target; None
    without a capacity or without demand."""
    if not capacity or obs.demand_per_s <= 0:
        return None
    return _count(obs.demand_per_s / (capacity * policy.target_utilization))


CONGESTION_EXPONENT = 4
"""How steeply :func:`active_need` assumes a replica's in-flight tokens grow with its load (``x**p``)."""


def active_need(policy: Policy, obs: Observation, need: int) -> int:
    """The throughput need in active replicas: the fewest ``K >= need - Ws`` (``Ws`` the ready warm
    replicas serving, which carry their share of the ``need`` replicas in the Service) at which the
    active replicas would still run at or under the target utilisation once the pool is down to
    them, by the congestion model ``u' = u x (N / K) x (S / S')**(p - 1)`` (``S = N + Ws`` replicas
    serving now, ``S' = K + Ws``, ``p`` = :data:`CONGESTION_EXPONENT`: each replica's in-flight
    tokens grow as the ``p``-th power of its load, and utilisation divides every serving replica's
    tokens by the active ones alone); ``need`` when none below it does, or without a utilisation
    reading. Without the check a small pool flapped: down to the need less its warm replica, its
    utilisation read over the band, the warm replica was promoted, a new one loaded, and the floor
    dropped again (2 -> 1 -> 2 active every ~5 minutes in a closed-loop model at 15 req/s). With
    ``p = 2`` the same model still flapped where tokens grow faster than the square of the load
    (cubic, quartic, queueing-shaped ``x / (1 - x)``; review of 10,800 two-hour cases); ``p = 4``
    held in all but one of 384 such cases at 1-6 % more active replica-hours."""
    ws, n, u = obs.warm_serving, obs.active, obs.utilization
    if not ws or u is None or need <= 1:
        return need
    for k in range(max(1, need - ws), need):
        if k >= n or u * (n / k) * ((n + ws) / (k + ws)) ** (CONGESTION_EXPONENT - 1) <= policy.target_utilization:
            return k
    return need


def knee_contradicted(policy: Policy, obs: Observation, capacity: float | None) -> bool:
    """True when the pool refuses for capacity above the target with its replicas at least at the
    utilisation band (``u >= t(1-h)``), no replica on its way, and the remembered ``c`` saying the
    current replicas cover the demand: full replicas no longer admit what they did at the knee
    (longer prompts, a slower model server), so ``c`` is forgotten and the current ``A / n`` sizes
    the pool. Without this, a pool whose requests grew would refuse while the law answered "N
    replicas cover the demand" for up to :data:`CAPACITY_MEMORY_S`. Refusals from replicas well
    under the band (a breaker open, a TTFT deadline) are no such evidence: more replicas sized by
    their ``A / n`` would be GPUs bought for nothing (simulator, spike seed 1: 8 replicas at 5 %
    utilisation refusing 5.5 %; 3.94 -> 5.62 GPU-h at the same attainment when counted)."""
    if not capacity or obs.starting or obs.capacity_reject_rate <= policy.target_capacity_reject_rate:
        return False
    u = obs.utilization
    if u is None or u < policy.target_utilization * (1 - policy.hysteresis):
        return False
    return _count(obs.demand_per_s / (capacity * policy.target_utilization)) <= obs.active


def _is_idle(obs: Observation) -> bool:
    return obs.demand_per_s == 0 and obs.in_flight_tokens == 0 and obs.queue_depth == 0


def raw_recommendation(
    policy: Policy, obs: Observation, capacity: float | None = None, sustained: bool = True
) -> tuple[int, Reason]:
    """The unbounded, un-stabilised replica count the window asks for, and which rule gave it;
    ``capacity``: ``c``, the per-replica admitted rate remembered from the knee (None: unknown);
    ``sustained``: whether utilisation over the band has lasted :attr:`Policy.utilization_sustain_s`.

    Needs ``obs.reporting > 0`` and ``obs.window_s > 0``.
    """
    util_rec = _util_rec(policy, obs, sustained)
    if obs.capacity_reject_rate > policy.target_capacity_reject_rate:
        # D / (max(A / n, c) * t), written so that a trickle admitted gives a huge (then clamped) count, not inf
        if obs.demand_per_s < 1e6 * obs.admitted_per_s:
            replicas = obs.rate_replicas * (obs.demand_per_s / obs.admitted_per_s)  # D / (A / n)
            if (
                capacity
                and capacity * obs.rate_replicas > obs.admitted_per_s
                and not knee_contradicted(policy, obs, capacity)
            ):
                replicas = obs.demand_per_s / capacity  # D / c: the replicas admitted more at the knee
            demand_rec = _count(replicas / policy.target_utilization)
        else:  # (almost) nothing admitted: no measure of a replica's capacity; maxReplicas, step-limited
            demand_rec = 10**9
        # never below the current count while saturated: replicas still starting are already counted
        return max(demand_rec, util_rec, obs.active), Reason.SATURATED
    if _is_idle(obs):
        return 0, Reason.IDLE
    return util_rec, Reason.UTILIZATION if util_rec > obs.active else Reason.SCALE_DOWN


def decide(policy: Policy, obs: Observation, state: LawState, now_s: float) -> tuple[Decision, LawState]:
    """Apply the law (module docstring) to one observation; returns the decision and the new state.

    ``now_s`` is the caller's clock in seconds (any monotonic origin, used only for the cooldown).
    """
    n = obs.active
    first_s = now_s if state.first_s is None else state.first_s
    horizon = now_s - policy.scale_down_cooldown_s
    recs = tuple((t, r) for t, r in state.recommendations if t > horizon)
    knees = tuple((t, c) for t, c in state.knees if t > now_s - CAPACITY_MEMORY_S)
    rates = obs.reporting > 0 and obs.window_s > 0
    over = over_band(policy, obs)
    over_since = (now_s if state.over_band_since_s is None else state.over_band_since_s) if over else None
    sustained = over and now_s - over_since >= policy.utilization_sustain_s
    facts = {
        "capacity_reject_rate": obs.capacity_reject_rate if rates else None,
        "policy_reject_rate": obs.policy_reject_rate if rates else None,
        "utilization": obs.utilization,
    }

    # A hold keeps what KEDA already asked for: the active replicas and those still on their way to
    # serve (loading: Pending for a GPU node, pulling, loading the model). Holding at the active count
    # alone asks the HPA to drop the replicas still coming up, on no data at all.
    held = n + obs.loading
    holding = False
    if not rates:
        desired, holding = held, True
        if obs.stale:
            reason, why = Reason.HOLD_STALE, _stale_text(obs)
        elif n == 0 and obs.loading:
            reason, why = Reason.HOLD_WARMUP, f"holding: {obs.loading} replica(s) loading, none active yet"
        elif n == 0:
            reason, why = Reason.IDLE, "no active replicas"
        else:
            reason = Reason.HOLD_WARMUP
            why = f"holding: {obs.starting} replica(s) starting" if obs.starting else "holding: first sample"
    else:
        knee = knee_rate(policy, obs, sustained)
        if knee_contradicted(policy, obs, max((c for _, c in knees), default=None)):
            knees = ()  # what the replicas admitted at the old knee no longer holds (knee_contradicted)
        if knee is not None:
            knees = (*knees, (now_s, knee))
        capacity = max((c for _, c in knees), default=None)
        raw, rule = raw_recommendation(policy, obs, capacity, sustained)
        need = None
        if raw < n and rule is not Reason.IDLE:
            need = throughput_need(policy, obs, capacity)
            if need is not None:
                need = active_need(policy, obs, need)
            raw = max(raw, min(need or 0, n))
        raw = policy.clamp(raw)
        recs = (*recs, (now_s, raw))
        if raw < held and obs.stale:
            desired, reason, holding = held, Reason.HOLD_STALE, True
            why = f"{_stale_text(obs)} (demand fits {raw})"
        elif raw > n:
            limit = n + obs.warm + policy.max_scale_up_step
            desired = min(raw, limit)
            reason = rule if rule in (Reason.SATURATED, Reason.UTILIZATION) else Reason.BOUNDS
            why = _up_text(policy, obs, reason, raw, limit)
        elif raw < n:
            watched = first_s <= horizon
            floor = max(r for _, r in recs) if watched else max(n, *(r for _, r in recs))
            desired = min(n, floor)
            if desired < n:
                reason = Reason.IDLE if rule is Reason.IDLE else Reason.SCALE_DOWN
                why = _down_text(policy, obs, reason)
            else:
                reason = Reason.COOLDOWN
                higher = [t for t, r in recs if r >= n]
                lower_for = now_s - max([first_s, *higher])
                why = (
                    f"demand fits {raw}; holding for the scale-down cooldown "
                    f"({lower_for:.0f} s of {policy.scale_down_cooldown_s:.0f} s)"
                )
        else:
            desired, reason = n, Reason.STEADY
            why = f"steady (capacity reject {_pct(obs.capacity_reject_rate)}" + (
                f", utilisation {_pct(obs.utilization)})" if obs.utilization is not None else ")"
            )
            if need is not None and need >= n:
                why += f"; demand {obs.demand_per_s:.3g}/s needs {need} at the {_pct(policy.target_utilization)} target"
                if obs.warm_serving:
                    why += f" beside {obs.warm_serving} serving warm"
            if rule is Reason.SATURATED:
                why = f"capacity reject {_pct(obs.capacity_reject_rate)}, but {n} replicas cover the demand"
                why += f" ({obs.starting} starting)" if obs.starting else ""
            elif over and not sustained:
                why += (
                    f"; utilisation over the band for {now_s - over_since:.0f} s: acts once it lasts "
                    f"{policy.utilization_sustain_s:g} s"
                )
    if policy.clamp(desired) != desired:
        reason = Reason.BOUNDS
        why = (
            f"above maxReplicas {policy.max_replicas}"
            if desired > policy.max_replicas
            else f"below minReplicas {policy.min_replicas}"
        )
        desired = policy.clamp(desired)
    if holding and obs.loading and desired == held:
        why += f"; {obs.loading} replica(s) still loading counted"
    text = f"{n} -> {desired}: {why}"
    active = _is_active(obs, desired, rates)
    decision = Decision(
        current=n,
        desired=desired,
        reason=reason,
        text=text,
        # a hold is no scale-up: measured against the count the HPA holds (active + loading), never nudged
        metric_value=hpa_metric_value(desired, held if holding else n, policy.hpa_tolerance),
        active=active,
        time_s=now_s,
        **facts,
    )
    return decision, dataclasses.replace(
        state, first_s=first_s, recommendations=recs, knees=knees, over_band_since_s=over_since
    )


def _is_active(obs: Observation, desired: int, rates: bool) -> bool:
    """IsActive: demand, requests refused or queued, replicas still starting or loading, or data we cannot trust.

    With ``minReplicas: 0`` KEDA scales to 0 once this has been False for ``cooldownPeriod``, from
    any count at once (KEDA v2.21.0 ``pkg/scaling/executor/scale_scaledobjects.go``, scale to zero
    bypasses the HPA): so a replica still loading its model (longer than the cooldown) keeps it
    True, and so do two or more active replicas: the HPA brings an idle pool down to one in its
    ``behavior``'s steps, and only the last replica is KEDA's to take.
    """
    if obs.stale or obs.starting or obs.loading or obs.queue_depth or obs.in_flight_tokens:
        return True
    if obs.active > 1:
        return True
    if rates and (obs.demand_per_s > 0 or obs.policy_rejected_per_s > 0):
        return True
    if not rates and obs.active > 0:
        return True  # no rates yet: cannot tell idle from busy, so never let KEDA drop to zero
    return desired > 0 and desired > obs.active


def _stale_text(obs: Observation) -> str:
    names = ", ".join(obs.stale[:3]) + (", ..." if len(obs.stale) > 3 else "")
    return f"holding: no fresh stats from {len(obs.stale)} pod(s) in the Service ({names})"


def _up_text(policy: Policy, obs: Observation, reason: Reason, raw: int, limit: int) -> str:
    if reason is Reason.SATURATED:
        n = obs.capacity_rejected_tenants
        why = f"capacity reject {_pct(obs.capacity_reject_rate)} across {n} tenant{'' if n == 1 else 's'}"
    elif reason is Reason.UTILIZATION:
        why = f"token utilisation {_pct(obs.utilization or 0)} over target {_pct(policy.target_utilization)}"
    else:
        why = f"below minReplicas {policy.min_replicas}"
    if raw > limit:
        why += f" (step-limited; demand asks {raw})"
    if obs.warm:
        why += f" ({obs.warm} warm promoted first)"
    return why


def _down_text(policy: Policy, obs: Observation, reason: Reason) -> str:
    cooldown = f"{policy.scale_down_cooldown_s:.0f} s"
    if reason is Reason.IDLE:
        return f"idle for {cooldown}"
    u = obs.utilization
    util = f"utilisation {_pct(u)}" if u is not None else "lower demand"
    return f"{util} under target {_pct(policy.target_utilization)} for {cooldown}"
