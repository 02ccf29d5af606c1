"""The sidecar's Prometheus metrics (one registry per sidecar, served on ``/metrics``).

Names and labels:

- ``tidegate_admission_decisions_total{pool,tenant,priority,decision,reason}``: every decision;
  ``decision`` is ``admit`` / ``admit_demoted`` / ``reject``, ``reason`` empty unless rejected.
  ``tenant`` is bounded: tenants listed in the config first, then the first seen, up to
  ``tenancy.metricsTopTenants`` names; every other tenant is ``other`` (labels stay stable over
  the process life, so no series flips between a name and ``other``); ``priority`` is a configured
  class name or ``unknown`` (a client's header never creates a series);
- ``tidegate_admission_in_flight_tokens{pool}``, ``_in_flight_requests{pool}``, ``_queue_depth{pool}``,
  ``_token_budget{pool}``, ``_max_concurrency{pool}`` (the numbers in force: configured, or read from
  the model server, see :mod:`tidegate.admission.sizing`; NaN while still being read: unknown, not
  0), ``_budget_fallback{pool}`` (1 while one of
  them is a fallback because the server reported no capacity) (gauges, read at scrape time; every
  gauge here carries ``pool`` like the counters, so series from a scrape without target labels still
  say whose they are);
- ``tidegate_admission_started_at_seconds{pool}``: Unix time the sidecar started, so its counters count
  from then (the Prometheus signal source reads a young replica's share of the rate window from it);
- ``tidegate_admission_breaker_state{pool,state}``: 1 for the current state, 0 for the others;
- ``tidegate_admission_upstream_responses_total{pool,code}``: answers of the model server to
  admitted requests, by status: the exact code for the common ones (:data:`UPSTREAM_CODES`), else
  its class (``2xx``, ``3xx``, ``4xx``, ``5xx``), so the label stays bounded whatever a server
  sends; a request that got no status (unreachable, timed out or cancelled before the headers) is
  not counted;
- ``tidegate_admission_ttft_seconds{pool,priority}``, ``tidegate_admission_e2e_seconds{pool,priority}``
  (histograms, admitted requests that reached the backend);
- ``tidegate_admission_slo_total{pool,priority,met}``: admitted requests whose TTFT met (``true``)
  or missed (``false``) their class SLO; the met share is ``sum(met="true") / sum``;
- ``tidegate_admission_usage_missing_total{pool}``: responses charged without reported usage;
- ``tidegate_admission_shed_total{pool,tenant,priority}``: admitted requests aborted in flight for
  running far past their prediction (``shedAfterMultiple``; their decision was already counted);
- ``tidegate_backend_kv_cache_usage_ratio{pool}``; ``tidegate_backend_telemetry_age_seconds{pool}`` (the oldest
  load signal in use: KV gauge, engine queue); ``tidegate_backend_requests_running``,
  ``tidegate_backend_requests_queued`` (the engine's own counts, NaN where not read);
  ``tidegate_admission_backend_queue_held`` (1 while new work waits here because the engine queues);
- ``tidegate_admission_telemetry_up{pool}``: 1 while every backend signal read for this engine reads
  cleanly, 0 while one does not (the log says which, once per episode);
  ``tidegate_admission_telemetry_errors_total{pool,source,kind}``: failed reads, ``source``
  ``metrics`` (load signals) or ``capacity``, ``kind`` from
  :class:`~tidegate.admission.telemetry.ErrorKind` (``unreachable``, ``http_status``, ``undecodable``,
  ``unparsable``, ``metric_missing``, ``invalid_value``);
- ``tidegate_gpu_memory_used_ratio{pool}``, ``tidegate_gpu_utilization_ratio{pool}``,
  ``tidegate_gpu_clock_throttle_reasons{pool}`` (NVML bitmask), where a GPU is visible.
"""

import math
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tidegate.admission.breaker import BreakerState
from tidegate.admission.engine import Engine
from tidegate.admission.sizing import Source
from tidegate.admission.ticket import Ticket

_CACHED_CHILDREN = 4096  # label children remembered per metric (keys include raw tenant names: bounded)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600)
OTHER = "other"
UNKNOWN = "unknown"
UPSTREAM_CODES = frozenset({200, 400, 401, 403, 404, 408, 413, 422, 429, 500, 502, 503, 504})
"""Upstream statuses labelled by their exact code; any other is labelled by its class."""


def status_label(status: int) -> str:
    """The ``code`` label of an upstream status: exact for :data:`UPSTREAM_CODES`, else ``Nxx``."""
    if status in UPSTREAM_CODES:
        return str(status)
    return f"{min(max(status // 100, 1), 5)}xx"


class TenantLabels:
    """Bounded tenant label values: named tenants up to ``top_n``, then ``other``."""

    def __init__(self, top_n: int, preferred: list[str]) -> None:
        self.top_n = top_n
        self._named: set[str] = set(preferred[:top_n])

    def label(self, tenant: str) -> str:
        if tenant in self._named:
            return tenant
        if len(self._named) < self.top_n:
            self._named.add(tenant)
            return tenant
        return OTHER


class SidecarMetrics:
    """Every metric of one sidecar; gauges read ``engine()`` at scrape time."""

    def __init__(
        self, pool: str, engine: Callable[[], Engine], gpu: Callable[[], object | None], started_at_s: float = math.nan
    ) -> None:
        self.pool = pool
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "tidegate_admission_decisions", "Admission decisions.",
            ["pool", "tenant", "priority", "decision", "reason"], registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            "tidegate_admission_ttft_seconds", "Time to first token of admitted requests (from arrival).",
            ["pool", "priority"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "tidegate_admission_e2e_seconds", "End-to-end time of admitted requests (from arrival).",
            ["pool", "priority"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.slo = Counter(
            "tidegate_admission_slo", "Admitted requests by whether TTFT met the class SLO.",
            ["pool", "priority", "met"], registry=r,
        )  # fmt: skip
        self.usage_missing = Counter(
            "tidegate_admission_usage_missing", "Responses without reported usage (charged counted tokens or the reservation).",
            ["pool"], registry=r,
        )  # fmt: skip
        self.shed_requests = Counter(
            "tidegate_admission_shed", "Admitted requests aborted in flight for running far past their prediction.",
            ["pool", "tenant", "priority"], registry=r,
        )  # fmt: skip
        gauges: dict[str, tuple[str, Callable[[], float]]] = {
            "tidegate_admission_in_flight_tokens": ("Reserved tokens in flight.", lambda: engine().in_flight_tokens),
            "tidegate_admission_in_flight_requests": ("Requests in flight.", lambda: engine().in_flight_requests),
            "tidegate_admission_queue_depth": ("Requests waiting in the admission queue.", lambda: engine().queue.depth),
            "tidegate_admission_token_budget": ("Token budget in force (adaptive or configured); NaN while it is read "
                                                "from the model server.", lambda: _budget(engine())),
            "tidegate_admission_max_concurrency": ("Replica concurrency cap in force; NaN while it is read from the "
                                                   "model server.", lambda: _concurrency(engine())),
            "tidegate_admission_budget_fallback": ("1 while the budget or concurrency is a fallback: unset, and the model "
                                                   "server reported no capacity.", lambda: float(engine().sizing.fallback)),
            "tidegate_backend_kv_cache_usage_ratio": ("Backend KV-cache usage (0..1), last reading.",
                                                      lambda: _nan(engine().kv.value)),
            "tidegate_backend_telemetry_age_seconds": ("Seconds since the oldest backend load signal in use was read.",
                                                       lambda: _nan(engine().telemetry_age_s())),
            "tidegate_backend_requests_running": ("Requests the model server reports running.",
                                                  lambda: _nan(engine().backend_running)),
            "tidegate_backend_requests_queued": ("Requests waiting in the model server's own queue.",
                                                 lambda: _nan(engine().backend_queue.value)),
            "tidegate_admission_backend_queue_held": ("1 while new work waits here because the model server queues.",
                                                      lambda: float(engine().backend_queue_held)),
            "tidegate_gpu_memory_used_ratio": ("GPU memory used / total (worst device).",
                                               lambda: _nan(getattr(gpu(), "memory_usage", None))),
            "tidegate_gpu_utilization_ratio": ("GPU utilisation (worst device, 0..1).",
                                               lambda: _nan(getattr(gpu(), "utilization", None))),
            "tidegate_gpu_clock_throttle_reasons": ("NVML clock event/throttle reasons bitmask (OR of devices).",
                                                    lambda: _nan(getattr(gpu(), "throttle_reasons", None))),
        }  # fmt: skip
        for name, (doc, read) in gauges.items():
            Gauge(name, doc, ["pool"], registry=r).labels(pool).set_function(read)
        Gauge(
            "tidegate_admission_started_at_seconds", "Unix time this sidecar started (its counters count from then).",
            ["pool"], registry=r,
        ).labels(pool).set(started_at_s)  # fmt: skip
        breaker = Gauge(
            "tidegate_admission_breaker_state", "Circuit breaker state (1 = current).", ["pool", "state"], registry=r
        )
        for state in BreakerState:
            breaker.labels(pool, state.value).set_function(lambda s=state: float(engine().breaker_state is s))
        self.upstream_responses = Counter(
            "tidegate_admission_upstream_responses", "Model server answers to admitted requests, by status.",
            ["pool", "code"], registry=r,
        )  # fmt: skip
        self.tenants = TenantLabels(20, [])
        self.classes: frozenset[str] = frozenset()
        # ``labels()`` costs a few µs per call (argument checks, a lock, a dict lookup); the hot path
        # keeps the children it used, keyed by the raw values, and forgets them when labels change.
        self._decision_children: dict[tuple[str, str, object, object], Any] = {}
        self._latency_children: dict[str, tuple[Any, Any]] = {}
        self._slo_children: dict[tuple[str, bool], Any] = {}
        self.usage_missing_child = self.usage_missing.labels(pool)
        self.telemetry_errors = Counter(
            "tidegate_admission_telemetry_errors", "Failed reads of the model server's telemetry.",
            ["pool", "source", "kind"], registry=r,
        )  # fmt: skip
        up = Gauge(
            "tidegate_admission_telemetry_up", "1 while every backend signal reads cleanly.", ["pool"], registry=r
        )
        self.telemetry_up_child = up.labels(pool)
        self.telemetry_up_child.set(1)

    def configure(self, top_n: int, preferred: list[str], classes: list[str] | None = None) -> None:
        """Label bounds from the config: tenants (keeps names already handed out) and class names."""
        old = self.tenants
        self.tenants = TenantLabels(top_n, preferred)
        for name in getattr(old, "_named", set()):
            self.tenants.label(name)
        if classes is not None:
            self.classes = self.classes | frozenset(classes)
        self._decision_children.clear()

    def priority(self, name: str) -> str:
        """A configured class name, else ``unknown`` (the header is client input: bounded labels)."""
        return name if name in self.classes else UNKNOWN

    def decision(self, ticket: Ticket) -> None:
        """Count one settled decision (admitted, demoted or rejected)."""
        key = (ticket.tenant, ticket.priority, ticket.outcome, ticket.reason)
        child = self._decision_children.get(key)
        if child is None:
            if len(self._decision_children) >= _CACHED_CHILDREN:
                self._decision_children.clear()
            reason = ticket.reason.value if ticket.reason is not None else ""
            child = self._decision_children[key] = self.decisions.labels(
                self.pool,
                self.tenants.label(ticket.tenant),
                self.priority(ticket.priority),
                ticket.outcome.value,
                reason,
            )
        child.inc()

    def upstream_response(self, status: int) -> None:
        """Count one answer of the model server (``status`` 0: none came, nothing is counted)."""
        if status:
            self.upstream_responses.labels(self.pool, status_label(status)).inc()

    def telemetry_problem(self, source: str, kind: str) -> None:
        """Count one failed read of the backend's telemetry (``source`` and ``kind`` are closed sets)."""
        self.telemetry_errors.labels(self.pool, source, kind).inc()

    def shed(self, ticket: Ticket) -> None:
        """Count one request shed in flight."""
        self.shed_requests.labels(self.pool, self.tenants.label(ticket.tenant), self.priority(ticket.priority)).inc()

    def finished(self, ticket: Ticket, ttft_s: float | None, e2e_s: float, slo_s: float | None) -> None:
        """Latency of one admitted request (times from its arrival at the sidecar)."""
        latency = self._latency_children.get(ticket.priority)
        if latency is None:
            latency = self._latency_children[ticket.priority] = (
                self.ttft.labels(self.pool, ticket.priority), self.e2e.labels(self.pool, ticket.priority),
            )  # fmt: skip
        if ttft_s is not None:
            latency[0].observe(ttft_s)
            if slo_s is not None:
                met = ttft_s <= slo_s
                slo = self._slo_children.get((ticket.priority, met))
                if slo is None:
                    slo = self._slo_children[(ticket.priority, met)] = self.slo.labels(
                        self.pool, ticket.priority, "true" if met else "false"
                    )
                slo.inc()
        latency[1].observe(e2e_s)

    def render(self) -> bytes:
        """The exposition text of every metric."""
        return generate_latest(self.registry)


def _nan(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def _budget(engine: Engine) -> float:
    """The token budget in force; NaN while pending (unknown, not 0)."""
    return _nan(None if engine.sizing.budget_source is Source.PENDING else engine.token_budget)


def _concurrency(engine: Engine) -> float:
    """The concurrency cap in force; NaN while pending."""
    return _nan(None if engine.sizing.concurrency_source is Source.PENDING else engine.admission.max_concurrency)
