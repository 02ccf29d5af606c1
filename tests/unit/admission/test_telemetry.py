"""Reading each engine's load signals and capacity, and saying so once when they cannot be read."""

import logging

import pytest

from tidegate.admission import telemetry
from tidegate.admission.config import parse
from tidegate.admission.engine import BackendCapacity
from tidegate.admission.poller import Episodes
from tidegate.admission.telemetry import ErrorKind, Problem, TelemetryError
from tidegate.api.pool import InferencePool
from tidegate.api.serving import Engine as BackendEngine
from tidegate.operator import builders

# As llama-server renders it (tools/server/server-task.cpp ``to_metrics``, llama.cpp 0c1e570).
LLAMACPP_PAGE = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 45
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 300
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 410
# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 345
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 0
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 1.5
"""
VLLM_PAGE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.61
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.4
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2000"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="2000"} 1.0
"""


def test_llamacpp_load_signals_are_processing_deferred_and_decode_steps() -> None:
    problems: list[Problem] = []
    reading = telemetry.parse_backend_metrics(LLAMACPP_PAGE, BackendEngine.LLAMACPP, problems)
    assert (reading.requests_running, reading.requests_queued, reading.generation_tokens_total) == (2, 3, 410)
    assert reading.kv_cache_usage is None and problems == []  # no KV gauge on current builds: not a problem


def test_a_long_llamacpp_generation_shows_progress_before_it_ends() -> None:
    """llama-server adds to tokens_predicted_total only when a slot is released: read alone, a
    generation longer than requestTimeoutSeconds looked stalled and opened the breaker (found in
    front of the real server); its decode-step counter moves every step."""
    before = telemetry.parse_backend_metrics(LLAMACPP_PAGE, BackendEngine.LLAMACPP)
    page = LLAMACPP_PAGE.replace("llamacpp:n_decode_total 410", "llamacpp:n_decode_total 470")
    during = telemetry.parse_backend_metrics(page, BackendEngine.LLAMACPP)  # tokens_predicted_total unchanged
    assert during.generation_tokens_total > before.generation_tokens_total


def test_vllm_signals_sum_engines_and_capacity_is_blocks_times_block_size() -> None:
    problems: list[Problem] = []
    reading = telemetry.parse_backend_metrics(VLLM_PAGE, BackendEngine.VLLM, problems)
    assert (reading.requests_running, reading.requests_queued) == (12, 2)
    assert reading.kv_cache_usage == 0.61  # the fullest engine
    assert reading.capacity == BackendCapacity(kv_tokens=2 * 2000 * 16)
    assert problems == []


def test_a_metric_the_engine_serves_but_the_page_lacks_is_a_problem() -> None:
    problems: list[Problem] = []
    page = "\n".join(line for line in LLAMACPP_PAGE.splitlines() if "requests_deferred" not in line) + "\n"
    reading = telemetry.parse_backend_metrics(page, BackendEngine.LLAMACPP, problems)
    assert reading.requests_queued is None and reading.requests_running == 2
    assert problems == [Problem(ErrorKind.METRIC_MISSING, "llamacpp:requests_deferred not on the metrics page")]
    unrelated: list[Problem] = []  # e.g. metricsPath pointing at another exporter
    telemetry.parse_backend_metrics("process_cpu_seconds_total 1.0\n", BackendEngine.VLLM, unrelated)
    assert {p.kind for p in unrelated} == {ErrorKind.METRIC_MISSING}
    assert {p.source for p in unrelated} == {"metrics", "capacity"}


def test_tgi_gauges_read_zero_until_a_request_went_through_then_must_be_there() -> None:
    fresh: list[Problem] = []
    reading = telemetry.parse_backend_metrics("tgi_request_count 0\n", BackendEngine.TGI, fresh, served_any=False)
    assert (reading.requests_queued, reading.requests_running) == (0, 0) and fresh == []
    later: list[Problem] = []
    assert telemetry.parse_backend_metrics("x 0\n", BackendEngine.TGI, later).requests_queued is None
    assert [p.kind for p in later] == [ErrorKind.METRIC_MISSING, ErrorKind.METRIC_MISSING]
    busy = telemetry.parse_backend_metrics("tgi_queue_size 4\ntgi_batch_current_size 8\n", BackendEngine.TGI)
    assert (busy.requests_queued, busy.requests_running) == (4, 8)


def test_a_negative_count_is_invalid_not_zero() -> None:
    problems: list[Problem] = []
    page = LLAMACPP_PAGE.replace("llamacpp:requests_deferred 3", "llamacpp:requests_deferred -1")
    assert telemetry.parse_backend_metrics(page, BackendEngine.LLAMACPP, problems).requests_queued is None
    assert [p.kind for p in problems] == [ErrorKind.INVALID_VALUE]


def test_vllm_capacity_before_the_cache_is_sized_is_unknown() -> None:
    page = VLLM_PAGE.replace('num_gpu_blocks="2000"', 'num_gpu_blocks="None"')
    problems: list[Problem] = []
    assert telemetry.parse_backend_metrics(page, BackendEngine.VLLM, problems).capacity is None
    assert [(p.kind, p.source) for p in problems] == [(ErrorKind.METRIC_MISSING, "capacity")]


def test_llamacpp_capacity_from_slots_or_props_and_tgi_from_info() -> None:
    slots = [{"id": i, "n_ctx": 1024, "speculative": False, "is_processing": i == 0} for i in range(2)]
    assert telemetry.parse_llamacpp_slots(slots) == BackendCapacity(slots=2, context_tokens=1024)
    props = {"total_slots": 2, "default_generation_settings": {"n_ctx": 1024, "params": {}}}
    assert telemetry.parse_llamacpp_props(props) == BackendCapacity(slots=2, context_tokens=1024)
    old_tgi = {"max_total_tokens": 4096, "max_batch_total_tokens": 32000, "max_concurrent_requests": 128}
    assert telemetry.parse_tgi_info(old_tgi) == BackendCapacity(kv_tokens=32000, context_tokens=4096, max_requests=128)
    assert telemetry.parse_tgi_info({"max_total_tokens": 4096}) == BackendCapacity(context_tokens=4096)
    for read, doc in [
        (telemetry.parse_llamacpp_slots, {"error": "x"}),
        (telemetry.parse_llamacpp_slots, [{"id": 0}]),
        (telemetry.parse_llamacpp_props, {"total_slots": 2}),
        (telemetry.parse_tgi_info, []),
    ]:
        with pytest.raises(TelemetryError) as err:
            read(doc)
        assert err.value.problem.kind is ErrorKind.UNPARSABLE and err.value.problem.source == "capacity"


def test_a_problem_is_logged_once_per_episode_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tidegate.admission.poller")
    episodes = Episodes()
    down = [Problem(ErrorKind.HTTP_STATUS, "GET /metrics: HTTP 501 (Start it with `--metrics`)")]
    for _ in range(5):
        episodes.update("metrics", down)
    episodes.update("capacity", [])
    assert not episodes.ok and episodes.error == "metrics: GET /metrics: HTTP 501 (Start it with `--metrics`)"
    episodes.update("metrics", [])
    episodes.update("metrics", [])
    assert episodes.ok and episodes.error is None
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in logged] == ["WARNING", "INFO"]
    assert "--metrics" in logged[0][1] and "telemetry.onStale" in logged[0][1]


def test_the_operators_config_carries_the_server_paths() -> None:
    pool = InferencePool.model_validate(
        {
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {
                "model": {"name": "m", "engine": "tgi"},
                "server": {"image": "tgi", "port": 80, "metricsPath": "/prom", "healthPath": "/healthz"},
            },
        }
    )
    config = parse(builders.admission_config_map(pool)["data"]["config.yaml"])
    assert (config.server.metrics_path, config.server.health_path) == ("/prom", "/healthz")
    assert parse("model: {name: m}\nserver: {metricsPath: metrics}\n").server.metrics_path == "/metrics"


def test_a_config_that_promises_more_than_the_server_holds_is_named_field_by_field():
    from tidegate.admission.engine import BackendCapacity
    from tidegate.api.admission import AdmissionSpec
    from tidegate.api.serving import ModelSpec

    model = ModelSpec.model_validate({"name": "m", "engine": "llamacpp", "maxContextTokens": 8192})
    admission = AdmissionSpec.model_validate({"tokenBudget": 32768, "maxConcurrency": 4})
    two_slots = BackendCapacity(slots=2, context_tokens=1024)
    found = telemetry.config_mismatches(model, admission, two_slots)
    assert [w.split(" ")[0] for w in found] == [
        "model.maxContextTokens",
        "admission.maxConcurrency",
        "admission.tokenBudget",
    ]
    assert "1024" in found[0] and "2 slots" in found[1] and "2048" in found[2]
    fits = AdmissionSpec.model_validate({"tokenBudget": 2048, "maxConcurrency": 2})
    small = ModelSpec.model_validate({"name": "m", "engine": "llamacpp", "maxContextTokens": 1024})
    assert telemetry.config_mismatches(small, fits, two_slots) == []
    assert telemetry.config_mismatches(model, admission, BackendCapacity()) == []  # nothing reported, nothing claimed
    vllm = telemetry.config_mismatches(
        small, AdmissionSpec.model_validate({"tokenBudget": 500_000}), BackendCapacity(kv_tokens=400_000)
    )
    assert len(vllm) == 1 and "400000" in vllm[0]
