"""The sidecar <-> scaler wire contract: the JSON stats document, its client, and a fake.

Each sidecar serves ``GET /tidegate/stats`` (:data:`STATS_PATH`) with one
:class:`StatsSnapshot`. All ``*_total`` fields are monotonic counters since the sidecar
process started (``instance_id`` changes on restart, so a reader can tell a counter reset from
a decrease); gauges are current values. The scaler turns two snapshots into rates.

Shape (JSON, snake_case)::

    {"schema_version": 1, "pool": "small", "pod": "small-7d9f-x", "role": "active", "serving": true,
     "instance_id": "9f0c...", "started_at_s": 1764480000.0, "time_s": 1764480123.4,
     "admitted_total": 812, "admitted_demoted_total": 40, "admitted_tokens_total": 951234,
     "completed_total": 790,
     "rejected_total": {"queue_full": 31, "tenant_rate": 12},
     "tenants": {"acme": {"admitted": 500, "admitted_tokens": 600000, "demoted": 40,
                          "capacity_rejected": 31, "policy_rejected": 0}},
     "in_flight_requests": 22, "in_flight_tokens": 40123, "token_budget": 262144,
     "max_concurrency": 256, "token_budget_source": "engine", "max_concurrency_source": "engine",
     "sizing_changes_total": 0,
     "queue_depth": 3, "breaker_state": "closed",
     "kv_cache_usage": 0.71, "telemetry_age_s": 0.4, "shed_total": 2,
     "telemetry_ok": true, "telemetry_error": null,
     "backend_requests_running": 20, "backend_requests_queued": 0, "backend_queue_held": false,
     "backend_kv_capacity_tokens": 262144, "backend_slots": null, "backend_context_tokens": null,
     "backend_max_requests": null,
     "config_warnings": []}

``token_budget`` and ``max_concurrency`` are the numbers this replica runs on now: the budget in
force (the adaptive budget's current value; its base is ``admission.tokenBudget`` or, unset, the
model server's KV capacity) and the concurrency cap, so the scaler sizes against what replicas
really hold. ``token_budget_source`` / ``max_concurrency_source`` say where each base came from:
``configured``, ``engine``, ``pending`` (not read yet: the replica refuses with ``not_active``) or
``fallback`` (the server reported none in time; also a ``config_warnings`` entry). While a number
is ``pending`` it is null: the replica does not know what it holds yet, and a reader must treat its
budget as unknown, not as zero capacity. Absent (an older sidecar): unknown. ``sizing_changes_total``
counts the times a budget or concurrency read from the server changed afterwards (the server
restarted with another shape; each is also logged as a WARNING with the old and new numbers);
absent: 0.

Backend telemetry, as this sidecar last read it from the model server: ``telemetry_ok`` is false
while a signal it reads for this engine cannot be read (``telemetry_error`` says which and why:
unreachable, HTTP status, undecodable, missing metric, nonsense value); ``telemetry_age_s`` is the
age of the oldest load signal in use (vLLM's KV gauge and waiting queue, llama.cpp's deferred
requests, TGI's queue), null until one was read. ``backend_requests_running`` /
``backend_requests_queued`` are the engine's own counts (vLLM running / waiting, llama.cpp processing /
deferred, TGI batch / queue size); ``backend_queue_held`` is true while new work waits in this
sidecar's queue because the engine queues requests itself. Capacity, as the engine reports it (null
where it does not): ``backend_kv_capacity_tokens`` (vLLM ``num_gpu_blocks`` x ``block_size``, TGI
``max_batch_total_tokens``), ``backend_slots`` and ``backend_context_tokens`` (llama.cpp slots and
context per slot, TGI ``max_total_tokens``), ``backend_max_requests`` (TGI ``max_concurrent_requests``). ``config_warnings``: each way the pool's config promises
more than the server reports holding (``telemetry.config_mismatches``; each is also logged once as a
WARNING). A document without these fields (an older sidecar) reads as telemetry ok and nothing known.

``serving`` says whether the replica takes requests now: the ``active`` role, or ``warm`` with the pod
labelled ``tidegate.dev/serving=true`` (``spec.warmPool.serve``), not draining and sized; null from an
older sidecar. The scaler reads who is in the Service from the pod labels, not from this field: it is
for an operator reading the stats (a serving warm replica reports ``role: warm``).

``shed_total`` counts admitted requests aborted in flight for running far past their prediction
(``shedAfterMultiple``); it is not demand and no scaling input, only what an operator reads.
A document without it (an older sidecar) reads as 0.

Times are Unix seconds (wall clock) so snapshots from different pods line up.
"""

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from tidegate.admission.reasons import CAPACITY_REASONS, POLICY_REASONS, Reason

STATS_PATH = "/tidegate/stats"
MAX_COUNT = 2**63 - 1
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
SCHEMA_VERSION = 1


class BreakerState(StrEnum):
    """Circuit breaker states."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class TenantCounters(BaseModel):
    """Monotonic per-tenant counters (tenants beyond the top-N are summed under ``other``)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    admitted: int = Field(default=0, ge=0, le=MAX_COUNT)
    admitted_tokens: int = Field(default=0, ge=0, le=MAX_COUNT)
    demoted: int = Field(default=0, ge=0, le=MAX_COUNT)
    capacity_rejected: int = Field(default=0, ge=0, le=MAX_COUNT)
    policy_rejected: int = Field(default=0, ge=0, le=MAX_COUNT)


class StatsSnapshot(BaseModel):
    """One sidecar's counters and gauges at ``time_s`` (see the module docstring for the shape).

    Counters are bounded to 64 bits and times must be finite: a document outside that is a
    broken pod (:class:`StatsError` for the reader), never a number to compute with.
    """

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)  # newer sidecars may add fields

    schema_version: int = SCHEMA_VERSION
    pool: str = ""
    pod: str = ""
    role: str = "active"
    serving: bool | None = None
    instance_id: str
    started_at_s: float
    time_s: float
    admitted_total: int = Field(default=0, ge=0, le=MAX_COUNT)
    admitted_demoted_total: int = Field(default=0, ge=0, le=MAX_COUNT)
    admitted_tokens_total: int = Field(default=0, ge=0, le=MAX_COUNT)
    completed_total: int = Field(default=0, ge=0, le=MAX_COUNT)
    rejected_total: dict[Reason, Count] = Field(default_factory=dict)
    tenants: dict[str, TenantCounters] = Field(default_factory=dict)
    in_flight_requests: int = Field(default=0, ge=0, le=MAX_COUNT)
    in_flight_tokens: int = Field(default=0, ge=0, le=MAX_COUNT)
    token_budget: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    max_concurrency: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    queue_depth: int = Field(default=0, ge=0, le=MAX_COUNT)
    breaker_state: BreakerState = BreakerState.CLOSED
    kv_cache_usage: float | None = Field(default=None, ge=0.0, le=1.0)
    telemetry_age_s: float | None = Field(default=None, ge=0.0)
    shed_total: int = Field(default=0, ge=0, le=MAX_COUNT)
    telemetry_ok: bool = True
    telemetry_error: str | None = Field(default=None, max_length=4096)
    backend_requests_running: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    backend_requests_queued: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    backend_queue_held: bool = False
    backend_kv_capacity_tokens: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    backend_slots: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    backend_context_tokens: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    backend_max_requests: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    config_warnings: list[str] = Field(default_factory=list, max_length=16)
    token_budget_source: str | None = Field(default=None, max_length=32)
    max_concurrency_source: str | None = Field(default=None, max_length=32)
    sizing_changes_total: int = Field(default=0, ge=0, le=MAX_COUNT)

    @property
    def capacity_rejected_total(self) -> int:
        """Rejections for lack of capacity (the ones that buy GPUs)."""
        return _sum(self.rejected_total, CAPACITY_REASONS)

    @property
    def policy_rejected_total(self) -> int:
        """Rejections by policy (tenant over quota, bad request, ...): never buy GPUs."""
        return _sum(self.rejected_total, POLICY_REASONS)


def _sum(counts: Mapping[Reason, int], reasons: frozenset[Reason]) -> int:
    return sum(n for reason, n in counts.items() if reason in reasons)


class StatsError(Exception):
    """A sidecar's stats could not be read (connection, timeout, HTTP status or bad document)."""


async def fetch(session: aiohttp.ClientSession, base_url: str, timeout_s: float = 2.0) -> StatsSnapshot:
    """Read one sidecar's stats from ``{base_url}/tidegate/stats``.

    Raises :class:`StatsError` on any failure (the caller treats the pod as missing data,
    never as zero demand).
    """
    url = base_url.rstrip("/") + STATS_PATH
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                raise StatsError(f"{url}: HTTP {resp.status}")
            return StatsSnapshot.model_validate_json(await resp.read())
    except StatsError:
        raise
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise StatsError(f"{url}: {type(exc).__name__}: {exc}") from exc


class FakeSidecar:
    """A real HTTP server over loopback that serves a settable :class:`StatsSnapshot`.

    For scaler tests: ``async with FakeSidecar(snapshot) as fake: ... fake.url ...``; set
    ``fake.snapshot`` to advance counters, or ``fake.status = 503`` to simulate a failing pod.
    """

    def __init__(self, snapshot: StatsSnapshot, host: str = "127.0.0.1", port: int = 0) -> None:
        self.snapshot = snapshot
        self.status = 200
        self._host, self._port = host, port
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _handle(self, _request: web.Request) -> web.Response:
        if self.status != 200:
            return web.Response(status=self.status, text="unavailable")
        return web.Response(body=self.snapshot.model_dump_json(), content_type="application/json")

    async def __aenter__(self) -> "FakeSidecar":
        app = web.Application()
        app.router.add_get(STATS_PATH, self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{self._host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
