"""An unset token budget and concurrency come from the model server's own capacity (issue 13).

What a platform engineer sees: a pool that sets neither number runs each replica on what its
engine reports holding; before that is read the replica does not serve; an engine that never
reports gets a conservative fallback, said loudly; an explicit number always wins.
"""

import logging

import pytest

from tidegate.admission import sizing, telemetry
from tidegate.admission.cost import RequestCost
from tidegate.admission.engine import BackendCapacity, Engine, EngineTuning, Telemetry
from tidegate.admission.reasons import Reason
from tidegate.admission.sizing import Source
from tidegate.admission.ticket import TicketState
from tidegate.api.admission import FALLBACK_MAX_CONCURRENCY, FALLBACK_TOKEN_BUDGET, AdmissionSpec
from tidegate.api.serving import Engine as BackendEngine
from tidegate.api.serving import ModelSpec

from .helpers import FakeClock

pytestmark = pytest.mark.unit

VLLM_PAGE = """\
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="25000"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1
vllm:num_requests_running{engine="0",model_name="m"} 0
vllm:num_requests_waiting{engine="0",model_name="m"} 0
vllm:generation_tokens_total{engine="0",model_name="m"} 5
"""


def auto_engine(engine: BackendEngine = BackendEngine.VLLM, clock: FakeClock | None = None, **spec: object) -> Engine:
    """An engine whose pool sets neither ``tokenBudget`` nor ``maxConcurrency`` (unless ``spec`` does)."""
    model = ModelSpec(name="m", engine=engine, max_context_tokens=1024)
    return Engine(AdmissionSpec.model_validate(spec), model, clock or FakeClock())


def test_vllm_budget_is_its_kv_cache_and_concurrency_its_default_max_num_seqs() -> None:
    engine = auto_engine()
    engine.note_backend_healthy()
    engine.observe_telemetry(telemetry.parse_backend_metrics(VLLM_PAGE, BackendEngine.VLLM))
    assert (engine.token_budget, engine.admission.max_concurrency) == (25_000 * 16, 256)
    assert (engine.sizing.budget_source, engine.sizing.concurrency_source) == (Source.ENGINE, Source.ENGINE)


def test_llamacpp_budget_is_slots_times_context_and_concurrency_its_slots() -> None:
    engine = auto_engine(BackendEngine.LLAMACPP)
    slots = [{"id": i, "n_ctx": 1024, "is_processing": False} for i in range(2)]
    engine.observe_telemetry(Telemetry(capacity=telemetry.parse_llamacpp_slots(slots)))
    assert (engine.token_budget, engine.admission.max_concurrency) == (2048, 2)
    # the engine's own numbers bound admission: no third request runs beside the two slots
    tickets = [engine.submit("t", None, RequestCost.fixed(100, 100)) for _ in range(3)]
    assert [t.state for t in tickets[:2]] == [TicketState.ADMITTED, TicketState.ADMITTED]
    assert tickets[2].state is not TicketState.ADMITTED and engine.in_flight_requests == 2


def test_tgi_concurrency_is_max_concurrent_requests_and_budget_its_batch_tokens() -> None:
    engine = auto_engine(BackendEngine.TGI)
    info = {"max_total_tokens": 4096, "max_batch_total_tokens": 32000, "max_concurrent_requests": 128}
    engine.observe_telemetry(Telemetry(capacity=telemetry.parse_tgi_info(info)))
    assert (engine.token_budget, engine.admission.max_concurrency) == (32000, 128)


def test_an_explicit_number_overrides_the_engine() -> None:
    engine = auto_engine(BackendEngine.LLAMACPP, tokenBudget=1500, maxConcurrency=1)
    engine.observe_telemetry(Telemetry(capacity=BackendCapacity(slots=2, context_tokens=1024)))
    assert (engine.token_budget, engine.admission.max_concurrency) == (1500, 1)
    assert engine.sizing == sizing.Sizing(1500, 1, Source.CONFIGURED, Source.CONFIGURED)


def test_pending_until_read_and_a_loading_server_never_uses_up_the_wait() -> None:
    clock = FakeClock()
    engine = auto_engine(clock=clock)
    assert engine.sizing.pending
    clock.advance(3600)  # the model loads for an hour: the server never answered healthy
    engine.tick()
    assert engine.sizing.pending and not engine.sizing.fallback


def test_a_server_that_reports_nothing_falls_back_loudly_once_then_the_engine_wins(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    engine = auto_engine(BackendEngine.TGI, clock=clock)
    engine.note_backend_healthy()
    # TGI after 2.0 leaves max_batch_total_tokens out of /info: no KV total
    engine.observe_telemetry(Telemetry(capacity=BackendCapacity(context_tokens=4096, max_requests=128)))
    assert engine.sizing.budget_source is Source.PENDING and engine.admission.max_concurrency == 128
    clock.advance(EngineTuning().capacity_wait_s - 1)
    engine.tick()
    assert engine.sizing.pending
    with caplog.at_level(logging.WARNING, logger="tidegate.admission.engine"):
        clock.advance(1)
        engine.tick()
        clock.advance(60)
        engine.tick()
    assert engine.sizing.budget_source is Source.FALLBACK and engine.token_budget == FALLBACK_TOKEN_BUDGET
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "tokenBudget 65536" in warnings[0].getMessage()
    # a capacity read later replaces the fallback
    engine.observe_telemetry(Telemetry(capacity=BackendCapacity(kv_tokens=90_000, context_tokens=4096)))
    assert (engine.token_budget, engine.sizing.budget_source) == (90_000, Source.ENGINE)


def test_an_engine_that_never_reports_runs_on_the_fallback_at_once() -> None:
    engine = auto_engine(BackendEngine.OPENAI)
    assert not engine.sizing.pending
    assert (engine.token_budget, engine.admission.max_concurrency) == (FALLBACK_TOKEN_BUDGET, FALLBACK_MAX_CONCURRENCY)
    message = sizing.describe(engine.sizing, BackendEngine.OPENAI)
    assert message is not None and "maxConcurrency 64" in message
    big = Engine(
        AdmissionSpec(), ModelSpec(name="m", engine=BackendEngine.OPENAI, max_context_tokens=100_000), FakeClock()
    )
    assert big.token_budget == 100_000  # one full-context request must still fit


def test_the_adaptive_budget_moves_around_the_engine_budget() -> None:
    engine = auto_engine()
    assert engine.admission.adaptive_budget.enabled  # on by default
    engine.observe_telemetry(Telemetry(capacity=BackendCapacity(kv_tokens=100_000)))
    engine.capacity.token_budget = 60_000  # adapted down since
    engine.observe_telemetry(Telemetry(capacity=BackendCapacity(kv_tokens=100_000)))
    assert engine.token_budget == 60_000  # the same capacity read again keeps the adapted value
    engine.observe_telemetry(Telemetry(capacity=BackendCapacity(kv_tokens=40_000)))
    assert engine.token_budget == 40_000  # another server (a restart with other flags): a new base


def test_a_request_over_the_engine_budget_is_too_large() -> None:
    engine = auto_engine(BackendEngine.LLAMACPP)
    engine.observe_telemetry(Telemetry(capacity=BackendCapacity(slots=2, context_tokens=1024)))
    ticket = engine.submit("t", None, RequestCost.fixed(1500, 1000))
    assert ticket.reason is Reason.REQUEST_TOO_LARGE and "2048-token budget" in ticket.message


def test_unset_numbers_never_mismatch_the_server() -> None:
    model = ModelSpec(name="m", engine=BackendEngine.LLAMACPP, max_context_tokens=1024)
    capacity = BackendCapacity(slots=2, context_tokens=1024)
    assert telemetry.config_mismatches(model, AdmissionSpec(), capacity) == []
    explicit = AdmissionSpec(token_budget=100_000, max_concurrency=8)
    assert len(telemetry.config_mismatches(model, explicit, capacity)) == 2


def test_an_engine_that_never_reports_says_so_when_the_sidecar_starts(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tidegate.admission.engine"):
        engine = auto_engine(BackendEngine.OPENAI)
        engine.reconfigure(engine.configured, engine.model)  # a config reload: said once, not again
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "engine 'openai' reports no capacity" in warnings[0]
