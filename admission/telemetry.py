"""Backend and GPU telemetry: what the system gate and the stall detector read.

Backend metrics (Prometheus text from the model server's ``/metrics``; names from INTEROP.md):

=========  =========================================  ======================================
engine     KV-cache usage (0..1)                      token progress counter
=========  =========================================  ======================================
vllm       ``vllm:kv_cache_usage_perc``, older        ``vllm:generation_tokens_total``
           ``vllm:gpu_cache_usage_perc``
llamacpp   ``llamacpp:kv_cache_usage_ratio`` (older   ``llamacpp:tokens_predicted_total``
           builds only)
tgi        none (no KV gauge)                         none
openai     not read                                   not read
=========  =========================================  ======================================

Several series of one name (e.g. one per ``model_name``) are combined: usage by max, counters
by sum. A failed scrape produces no reading, so the gauge ages and the stale policy applies
(``telemetry.onStale``, see :mod:`tidegate.admission.gate`). So does a KV usage that is not a
ratio (NaN, infinite, negative, above 1): read as 0 it would admit everything, clamped to 1 refuse
everything; it is a missing signal instead, and the sidecar logs it once per episode.

GPU (NVML through ``pynvml`` from nvidia-ml-py): memory used/total (the gate), utilisation and
clock-throttle reasons (metrics only), the worst visible device. No NVML library or no GPU: the
GPU memory gate is off and :class:`Nvml` says so once.
"""

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from tidegate.admission.engine import Telemetry
from tidegate.api.serving import Engine as BackendEngine

log = logging.getLogger(__name__)

KV_USAGE_NAMES: dict[BackendEngine, tuple[str, ...]] = {
    BackendEngine.VLLM: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    BackendEngine.LLAMACPP: ("llamacpp:kv_cache_usage_ratio",),
    BackendEngine.TGI: (),
    BackendEngine.OPENAI: (),
}
KV_USAGE_SLACK = 1e-6
"""Rounding above 1.0 still read as a full cache (clamped to 1); anything larger is nonsense."""
PROGRESS_NAMES: dict[BackendEngine, tuple[str, ...]] = {
    BackendEngine.VLLM: ("vllm:generation_tokens_total",),
    BackendEngine.LLAMACPP: ("llamacpp:tokens_predicted_total",),
    BackendEngine.TGI: (),
    BackendEngine.OPENAI: (),
}


def parse_backend_metrics(text: str, engine: BackendEngine, problems: list[str] | None = None) -> Telemetry:
    """KV usage and token progress from one ``/metrics`` page (``None`` where absent).

    A KV usage sample that is not a finite ratio in 0..1 (NaN, +/-Inf, negative, above 1 beyond
    :data:`KV_USAGE_SLACK`) makes the KV reading ``None``, as if the gauge were absent: the last good
    reading ages and ``telemetry.onStale`` applies (module docstring). Each such sample is described
    in ``problems`` when a list is given. Raises ``ValueError`` when the text is not Prometheus
    exposition format.
    """
    kv_names, progress_names = KV_USAGE_NAMES[engine], PROGRESS_NAMES[engine]
    if not kv_names and not progress_names:
        return Telemetry()
    kv: dict[str, float] = {}
    invalid: set[str] = set()
    progress: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in kv_names:
                if not (math.isfinite(sample.value) and 0.0 <= sample.value <= 1.0 + KV_USAGE_SLACK):
                    invalid.add(sample.name)
                    if problems is not None:
                        problems.append(f"{sample.name}={sample.value!r}")
                kv[sample.name] = max(kv.get(sample.name, 0.0), sample.value)
            elif sample.name in progress_names:
                progress[sample.name] = progress.get(sample.name, 0.0) + sample.value
    name = next((n for n in kv_names if n in kv), None)
    usage = None if name is None or name in invalid else min(1.0, kv[name])
    total = next((progress[n] for n in progress_names if n in progress), None)
    return Telemetry(kv_cache_usage=usage, generation_tokens_total=total)


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
    return (*KV_USAGE_NAMES[engine], *PROGRESS_NAMES[engine])
