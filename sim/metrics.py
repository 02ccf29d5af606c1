"""``/metrics`` of the sim-backend under vLLM's metric names (V1 engine, ``vllm/v1/metrics/loggers.py``).

Every series carries vLLM's labels ``model_name`` and ``engine="0"``. Served:

- gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
  (a fraction 0..1), read from the replica model at scrape time unless frozen;
- counters ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
  ``vllm:num_preemptions_total``, ``vllm:request_success_total{finished_reason}``;
- histograms (vLLM's buckets) ``vllm:time_to_first_token_seconds``,
  ``vllm:inter_token_latency_seconds``, ``vllm:e2e_request_latency_seconds``,
  ``vllm:request_queue_time_seconds``;
- ``vllm:cache_config_info{block_size, num_gpu_blocks}`` = 1 (16-token blocks, as vLLM's default):
  the replica's KV capacity, rounded down to whole blocks. A sidecar whose pool leaves
  ``admission.tokenBudget`` unset sizes itself from it (:mod:`tidegate.admission.sizing`), as in
  front of vLLM; the policy simulator reads the same page (``tidegate_policy.reported_capacity``).

Each server has its own ``CollectorRegistry``, so several sim-backends run in one process.
Freezing (the ``freeze_metrics`` fault) pins the three gauges at a snapshot, as when vLLM's
gauges go stale because no engine step runs; counters and histograms keep moving.
"""

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tidegate.sim.faults import FROZEN_GAUGES

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TTFT_BUCKETS += (20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
REQUEST_BUCKETS += (120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
BLOCK_SIZE_TOKENS = 16


class VllmMetrics:
    """The metric families of one sim-backend.

    ``gauges`` returns the live values of :data:`~tidegate.sim.faults.FROZEN_GAUGES` (running and
    waiting sequences, KV usage 0..1). ``render()`` returns the exposition text (bytes).
    """

    def __init__(self, model_name: str, kv_capacity_tokens: int, gauges: Callable[[], Mapping[str, float]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._gauges = gauges
        self._frozen: dict[str, float] | None = None
        labels = {"model_name": model_name, "engine": "0"}
        names = list(labels)
        reg = self.registry

        def gauge(name: str, doc: str) -> None:
            Gauge(f"vllm:{name}", doc, names, registry=reg).labels(**labels).set_function(lambda: self._gauge(name))

        gauge("num_requests_running", "Number of requests in model execution batches.")
        gauge("num_requests_waiting", "Number of requests waiting to be processed.")
        gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", names, registry=reg)
        self.prompt_tokens = self.prompt_tokens.labels(**labels)
        gen = Counter("vllm:generation_tokens", "Number of generation tokens processed.", names, registry=reg)
        self.generation_tokens = gen.labels(**labels)
        pre = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", names, registry=reg)
        self.preemptions = pre.labels(**labels)
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=reg,
        )
        self._labels = labels
        self._success_by_reason: dict[str, Counter] = {}

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"vllm:{name}", doc, names, buckets=buckets, registry=reg).labels(**labels)

        self.ttft = histogram(
            "time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e = histogram(
            "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_BUCKETS
        )
        self.queue_time = histogram(
            "request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQUEST_BUCKETS
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["block_size", "num_gpu_blocks", "engine"],
            registry=reg,
        )
        info.labels(str(BLOCK_SIZE_TOKENS), str(kv_capacity_tokens // BLOCK_SIZE_TOKENS), "0").set(1)

    def _gauge(self, name: str) -> float:
        if self._frozen is not None:
            return self._frozen[name]
        return float(self._gauges()[name])

    def request_succeeded(self, finished_reason: str) -> None:
        child = self._success_by_reason.get(finished_reason)
        if child is None:
            child = self._success_by_reason[finished_reason] = self._success.labels(
                **self._labels, finished_reason=finished_reason
            )
        child.inc()

    def freeze(self, overrides: Mapping[str, float] | None) -> None:
        """Pin the gauges at their current values updated by ``overrides``; ``None`` unfreezes."""
        if overrides is None:
            self._frozen = None
            return
        snapshot = dict(self._frozen) if self._frozen is not None else {k: float(v) for k, v in self._gauges().items()}
        snapshot.update(overrides)
        self._frozen = {name: snapshot[name] for name in FROZEN_GAUGES}

    def render(self) -> bytes:
        return generate_latest(self.registry)
