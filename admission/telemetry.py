"""Backend and GPU telemetry: what the gate, the backend queue and the stall detector read.

Backend load signals, per engine, from the model server's Prometheus page (``server.metricsPath``,
default ``/metrics``). Several series of one name (one per ``model_name`` or ``engine``) are
combined: KV usage by max, counts and counters by sum.

- vLLM: KV usage ``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc`` before 0.9), running /
  queued ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``, progress
  ``vllm:generation_tokens_total``;
- llama.cpp: no KV gauge on current builds (old builds' ``llamacpp:kv_cache_usage_ratio`` is read
  where served), running / queued ``llamacpp:requests_processing`` / ``llamacpp:requests_deferred``,
  progress ``llamacpp:n_decode_total`` (one per decode step: ``tokens_predicted_total`` is only added
  to when a request ends, so a long generation would look stalled);
- TGI: no KV gauge, running / queued ``tgi_batch_current_size`` / ``tgi_queue_size``, no progress
  counter;
- ``openai``: nothing is read.

Capacity (:class:`~tidegate.admission.engine.BackendCapacity`, read at start and every
:data:`CAPACITY_REFRESH_S`):

- vLLM: ``vllm:cache_config_info{num_gpu_blocks, block_size}`` on the same page; KV capacity in
  tokens = ``num_gpu_blocks`` x ``block_size``, summed over engines;
- llama.cpp: ``GET /slots`` (one entry per slot: ``id``, ``n_ctx``, ``is_processing``; served unless
  the server runs with ``--no-slots``), else ``GET /props`` (``total_slots``,
  ``default_generation_settings.n_ctx``). No KV total: with ``--kv-unified`` the slots share one
  cache, so slots x ``n_ctx`` would overstate it;
- TGI: ``GET /info``: ``max_total_tokens`` (one sequence), ``max_concurrent_requests`` (requests it
  accepts at once, refusing more with 429; default 128) and ``max_batch_total_tokens`` (the batch's
  KV tokens; TGI 2.0 and older report it, later releases only log it).

What an unset ``tokenBudget`` / ``maxConcurrency`` makes of these: :mod:`tidegate.admission.sizing`.

Sources: vLLM ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``; ``kv_cache_usage_perc``
since v0.9, where ``gpu_cache_usage_perc`` was deprecated, and ``log_metrics_info`` for
``cache_config_info``); llama.cpp ``tools/server/server-task.cpp`` (``to_metrics``),
``tools/server/server-context.cpp`` (``/slots``, ``/props``, ``/metrics``, which answers 501 unless the
server runs with ``--metrics``) at commit 0c1e570, as vendored by llama-cpp-python 0.3.36; TGI
``docs/source/reference/metrics.md`` and ``router/src/lib.rs`` (``Info``). TGI registers its gauges
when first set (the ``metrics`` crate), so a fresh server has no ``tgi_queue_size`` yet: until this
sidecar has completed a request through it, an absent TGI gauge reads 0. Every read of llama.cpp's
``/metrics`` restarts the averaging window of its two throughput gauges (``prompt_tokens_seconds``,
``predicted_tokens_seconds``: "averaged over the window between two scrapes"), so a Prometheus that
scrapes llama-server directly sees them averaged over the sidecar's poll interval.

Problems (:class:`Problem`, a closed set of :class:`ErrorKind`): a value that is not what the
metric means (a KV usage that is NaN, infinite, negative or above 1; a negative count) makes that
signal ``None``, as if absent: the last good reading ages and ``telemetry.onStale`` applies (see
:mod:`tidegate.admission.gate`); read as 0 it would admit everything, clamped to 1 refuse
everything. A metric this engine should serve but does not is a problem too (wrong
``metricsPath``, a renamed metric). The caller logs and counts them (:mod:`tidegate.admission.poller`).

GPU (NVML through ``pynvml`` from nvidia-ml-py): memory used/total (the gate), utilisation and
clock-throttle reasons (metrics only), the worst visible device. No NVML library or no GPU: the
GPU memory gate is off and :class:`Nvml` says so once.
"""

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tidegate.admission.engine import BackendCapacity, Telemetry
from tidegate.api.admission import AdmissionSpec
from tidegate.api.serving import Engine as BackendEngine
from tidegate.api.serving import ModelSpec

log = logging.getLogger(__name__)

CAPACITY_REFRESH_S = 60.0
"""How often capacity (``/slots``, ``/props``, ``/info``) is read again: it changes only on a restart."""
CAPACITY_RETRY_S = 5.0
"""How soon a failed capacity read is tried again."""


class ErrorKind(StrEnum):
    """Why a signal could not be read (the ``kind`` label of ``tidegate_admission_telemetry_errors_total``)."""

    UNREACHABLE = "unreachable"  # connection refused or reset, timeout
    HTTP_STATUS = "http_status"  # answered, but not 200 (e.g. llama-server without --metrics: 501)
    UNDECODABLE = "undecodable"  # body not decodable (content encoding, charset)
    UNPARSABLE = "unparsable"  # not Prometheus text, or not the JSON document expected
    METRIC_MISSING = "metric_missing"  # read, but a metric this engine serves is absent
    INVALID_VALUE = "invalid_value"  # a value the metric cannot mean (KV usage not a ratio, count < 0)


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with one read: why (``kind``), a message for the log and the stats, and what
    it leaves unknown (``source``: ``metrics``, the load signals, or ``capacity``)."""

    kind: ErrorKind
    message: str
    source: str = "metrics"


class TelemetryError(Exception):
    """A read failed as a whole: :attr:`problem` says why."""

    def __init__(self, kind: ErrorKind, message: str, source: str = "metrics") -> None:
        super().__init__(message)
        self.problem = Problem(kind, message, source)


@dataclass(frozen=True, slots=True)
class EngineSignals:
    """The metric names read for one engine (first name present wins; see the module table)."""

    kv_usage: tuple[str, ...] = ()
    running: tuple[str, ...] = ()
    queued: tuple[str, ...] = ()
    progress: tuple[str, ...] = ()
    kv_required: bool = False
    lazy: bool = False  # gauges appear only once set: absent reads 0 until a request went through
    capacity_info: str | None = None  # an info metric with num_gpu_blocks and block_size labels


SIGNALS: dict[BackendEngine, EngineSignals] = {
    BackendEngine.VLLM: EngineSignals(
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        running=("vllm:num_requests_running",),
        queued=("vllm:num_requests_waiting",),
        progress=("vllm:generation_tokens_total",),
        kv_required=True,
        capacity_info="vllm:cache_config_info",
    ),
    BackendEngine.LLAMACPP: EngineSignals(
        kv_usage=("llamacpp:kv_cache_usage_ratio",),
        running=("llamacpp:requests_processing",),
        queued=("llamacpp:requests_deferred",),
        progress=("llamacpp:n_decode_total", "llamacpp:tokens_predicted_total"),
    ),
    BackendEngine.TGI: EngineSignals(running=("tgi_batch_current_size",), queued=("tgi_queue_size",), lazy=True),
    BackendEngine.OPENAI: EngineSignals(),
}
KV_USAGE_SLACK = 1e-6
"""Rounding above 1.0 still read as a full cache (clamped to 1); anything larger is nonsense."""


def parse_backend_metrics(
    text: str, engine: BackendEngine, problems: list[Problem] | None = None, *, served_any: bool = True
) -> Telemetry:
    """Load signals (and vLLM's KV capacity) from one metrics page; ``None`` where absent or invalid.

    Each invalid value and each missing metric this engine serves is described in ``problems``
    when a list is given (module docstring); ``served_any``: whether a request has completed
    through this server (TGI's gauges exist only from then on). Raises ``ValueError`` when the text
    is not Prometheus exposition format.
    """
    signals = SIGNALS[engine]
    wanted = {*signals.kv_usage, *signals.running, *signals.queued, *signals.progress}
    if not wanted:
        return Telemetry()
    problems = [] if problems is None else problems
    kv: dict[str, float] = {}
    sums: dict[str, float] = {}
    invalid: set[str] = set()
    blocks: dict[str, int] = {}  # engine label -> KV tokens (vLLM's cache_config_info)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, value = sample.name, sample.value
            if name == signals.capacity_info:
                tokens = _kv_tokens(sample.labels)
                if tokens is not None:
                    blocks[sample.labels.get("engine", "")] = tokens
            elif name not in wanted:
                continue
            elif name in signals.kv_usage:
                if not (math.isfinite(value) and 0.0 <= value <= 1.0 + KV_USAGE_SLACK):
                    invalid.add(name)
                    problems.append(Problem(ErrorKind.INVALID_VALUE, f"{name}={value!r} is not a ratio 0..1"))
                kv[name] = max(kv.get(name, 0.0), value)
            else:
                if not (math.isfinite(value) and value >= 0):
                    invalid.add(name)
                    problems.append(Problem(ErrorKind.INVALID_VALUE, f"{name}={value!r} is not a count"))
                sums[name] = sums.get(name, 0.0) + value
    kv_name = next((n for n in signals.kv_usage if n in kv), None)
    usage = None if kv_name is None or kv_name in invalid else min(1.0, kv[kv_name])
    if kv_name is None and signals.kv_required:
        problems.append(_missing(signals.kv_usage))

    def count(names: tuple[str, ...]) -> float | None:
        name = next((n for n in names if n in sums), None)
        if name is None:
            if names and signals.lazy and not served_any:
                return 0.0  # not registered yet: nothing was ever queued or batched
            if names:
                problems.append(_missing(names))
            return None
        return None if name in invalid else sums[name]

    running, queued, progress = count(signals.running), count(signals.queued), count(signals.progress)
    capacity = None
    if signals.capacity_info is not None:
        if blocks:
            capacity = BackendCapacity(kv_tokens=sum(blocks.values()))
        else:
            problems.append(_missing((signals.capacity_info,), "with num_gpu_blocks and block_size", "capacity"))
    return Telemetry(
        kv_cache_usage=usage,
        generation_tokens_total=progress,
        requests_running=None if running is None else round(running),
        requests_queued=None if queued is None else round(queued),
        capacity=capacity,
    )


def _missing(names: tuple[str, ...], detail: str = "", source: str = "metrics") -> Problem:
    spelled = " or ".join(names)
    return Problem(
        ErrorKind.METRIC_MISSING, f"{spelled} {detail + ' ' if detail else ''}not on the metrics page", source
    )


def _kv_tokens(labels: dict[str, str]) -> int | None:
    """``num_gpu_blocks`` x ``block_size`` from an info metric's labels (None before the cache is
    sized: vLLM writes ``None`` there until the engine has profiled memory)."""
    try:
        blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except (KeyError, ValueError):
        return None
    return blocks * size if blocks > 0 and size > 0 else None


def parse_llamacpp_slots(doc: Any) -> BackendCapacity:
    """llama.cpp ``GET /slots`` (a list of ``{"id", "n_ctx", "is_processing", ...}``): the slot count
    and the context per slot. Raises :class:`TelemetryError` (``unparsable``) for another shape."""
    if not isinstance(doc, list) or not doc:
        raise TelemetryError(ErrorKind.UNPARSABLE, "GET /slots: expected a non-empty list of slots", "capacity")
    contexts = [slot.get("n_ctx") if isinstance(slot, dict) else None for slot in doc]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in contexts):
        raise TelemetryError(ErrorKind.UNPARSABLE, "GET /slots: a slot without a positive n_ctx", "capacity")
    return BackendCapacity(slots=len(doc), context_tokens=min(contexts))  # type: ignore[type-var]


def parse_llamacpp_props(doc: Any) -> BackendCapacity:
    """llama.cpp ``GET /props``: ``total_slots`` and ``default_generation_settings.n_ctx`` (per slot).
    Raises :class:`TelemetryError` (``unparsable``) when either is missing."""
    settings = doc.get("default_generation_settings") if isinstance(doc, dict) else None
    slots = doc.get("total_slots") if isinstance(doc, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if not (_positive_int(slots) and _positive_int(n_ctx)):
        raise TelemetryError(
            ErrorKind.UNPARSABLE, "GET /props: no total_slots and default_generation_settings.n_ctx", "capacity"
        )
    return BackendCapacity(slots=slots, context_tokens=n_ctx)


def parse_tgi_info(doc: Any) -> BackendCapacity:
    """TGI ``GET /info``: ``max_total_tokens`` (one sequence), ``max_concurrent_requests`` (more are
    refused with 429) and, where reported, ``max_batch_total_tokens`` (KV tokens). Raises :class:`TelemetryError` (``unparsable``) without
    ``max_total_tokens``."""
    total = doc.get("max_total_tokens") if isinstance(doc, dict) else None
    if not _positive_int(total):
        raise TelemetryError(ErrorKind.UNPARSABLE, "GET /info: no max_total_tokens", "capacity")
    batch, requests = doc.get("max_batch_total_tokens"), doc.get("max_concurrent_requests")
    return BackendCapacity(
        kv_tokens=batch if _positive_int(batch) else None,
        context_tokens=total,
        max_requests=requests if _positive_int(requests) else None,
    )


def config_mismatches(model: ModelSpec, admission: AdmissionSpec, capacity: BackendCapacity) -> list[str]:
    """Where the pool's settings promise more than the model server reports it holds (empty: none).

    ``model.maxContextTokens`` above the server's context per sequence (llama.cpp per-slot
    ``n_ctx``, TGI ``max_total_tokens``): the sidecar admits requests the server refuses.
    ``admission.maxConcurrency`` above llama.cpp's slots: the surplus waits in the server's FIFO
    (the backend-queue hold then holds new work). ``admission.tokenBudget`` above the server's KV
    tokens (vLLM, TGI; llama.cpp: slots x context per slot): admission is not what bounds the load.
    Only numbers the pool sets are compared (unset ones are read from the server: nothing to mismatch).
    Each entry is one sentence naming the field to change. Pure.
    """
    found = []
    if capacity.context_tokens is not None and model.max_context_tokens > capacity.context_tokens:
        found.append(
            f"model.maxContextTokens {model.max_context_tokens} is more than the {capacity.context_tokens} tokens "
            "the model server holds per sequence: requests admitted here may be refused there"
        )
    if (
        admission.max_concurrency is not None
        and capacity.slots is not None
        and admission.max_concurrency > capacity.slots
    ):
        found.append(
            f"admission.maxConcurrency {admission.max_concurrency} is more than the model server's "
            f"{capacity.slots} slots: the surplus would wait in the server's own queue"
        )
    kv_tokens = capacity.kv_tokens
    if kv_tokens is None and capacity.slots is not None and capacity.context_tokens is not None:
        kv_tokens = capacity.slots * capacity.context_tokens
    if kv_tokens is not None and admission.token_budget is not None and admission.token_budget > kv_tokens:
        found.append(
            f"admission.tokenBudget {admission.token_budget} is more than the {kv_tokens} KV-cache tokens "
            "the model server reports: admission does not bound its load"
        )
    return found


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True, slots=True)
class GpuReading:
    """The worst visible GPU: memory used/total (0..1), utilisation (0..1), throttle reasons bitmask."""

    memory_usage: float
    utilization: float
    throttle_reasons: int
    devices: int


class Nvml:
    """NVML access where a GPU is visible; :attr:`available` False (and a log line) otherwise."""

    def __init__(self) -> None:
        self.available = False
        self.why_not = ""
        self._handles: list[object] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._nvml = pynvml
            self.available = bool(self._handles)
            if not self.available:
                self.why_not = "NVML reports no GPU"
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError, ...
            self.why_not = f"NVML unavailable: {type(exc).__name__}: {exc}"
        if not self.available:
            log.info("no GPU visible (%s): the GPU memory gate is off", self.why_not)

    def read(self) -> GpuReading | None:
        """One reading (blocking, ~1 ms per device: call it in a thread); None when unavailable."""
        if not self.available:
            return None
        nvml = self._nvml
        worst_memory = worst_util = 0.0
        throttle = 0
        for handle in self._handles:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            worst_memory = max(worst_memory, memory.used / memory.total if memory.total else 0.0)
            worst_util = max(worst_util, nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
            try:
                throttle |= nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
            except Exception:  # older drivers: the deprecated name, or not supported
                throttle |= _legacy_throttle(nvml, handle)
        return GpuReading(worst_memory, worst_util, throttle, len(self._handles))

    def close(self) -> None:
        """Shut NVML down (idempotent)."""
        if self.available:
            self.available = False
            self._nvml.nvmlShutdown()


def _legacy_throttle(nvml: object, handle: object) -> int:
    try:
        return int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))  # type: ignore[attr-defined]
    except Exception:
        return 0


def names_for(engine: BackendEngine) -> Iterable[str]:
    """Every backend metric name read for ``engine`` (for docs and logs)."""
    s = SIGNALS[engine]
    return (*s.kv_usage, *s.running, *s.queued, *s.progress, *((s.capacity_info,) if s.capacity_info else ()))
