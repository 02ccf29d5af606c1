"""Sizing: the token budget and concurrency one replica runs on, and where each number came from.

``admission.tokenBudget`` and ``admission.maxConcurrency`` are overrides; unset (the default), each
comes from the model server's own capacity as the sidecar reads it
(:class:`BackendCapacity`, sources in :mod:`tidegate.admission.telemetry`):

========================  ============================================  ===============================
engine                    token budget                                  max concurrency
========================  ============================================  ===============================
vLLM                      KV tokens (``cache_config_info``:             ``--max-num-seqs`` is not
                          ``num_gpu_blocks`` x ``block_size``)          published: vLLM's default 256
llama.cpp                 slots x ``n_ctx`` per slot (``/slots``,       slots (``--parallel``)
                          else ``/props``)
TGI                       ``max_batch_total_tokens`` (``/info``,        ``max_concurrent_requests``
                          TGI 2.0 and older); later: fallback           (``/info``; TGI refuses more)
openai (generic)          fallback                                      fallback
========================  ============================================  ===============================

llama.cpp's slots x ``n_ctx`` is its KV cache when each slot has its own share of ``--ctx-size``
(``--parallel N``, the documented setup); under ``--kv-unified`` (current builds turn it on when
``--parallel`` is left out) every slot reports the whole cache and the product overstates it by the
slot count: such a pool sets ``tokenBudget`` to ``--ctx-size``. Neither ``/slots`` nor ``/props``
says which (llama.cpp ``tools/server/server-context.cpp`` at 0c1e570).

Before the first read (:attr:`Source.PENDING`) the replica must not serve: the sidecar is not ready
and refuses with ``not_active`` (its shell decides that; this module only says so). The wait is
bounded: once the model server has answered healthy and :attr:`waited_out` (the engine's clock,
:attr:`~tidegate.admission.capacity.EngineTuning.capacity_wait_s`), or at once for an engine that
never reports capacity (``openai``), a missing number takes its fallback
(:data:`~tidegate.api.admission.FALLBACK_TOKEN_BUDGET`, at least ``model.maxContextTokens``;
:data:`~tidegate.api.admission.FALLBACK_MAX_CONCURRENCY`) with :attr:`Source.FALLBACK`, which the
sidecar logs as a WARNING and shows in its stats and metrics. A capacity read later replaces it, and
so does one that changes later (the server restarted with other flags: the poller reads it again when
the server turns healthy again, when its progress counter drops, and every 60 s); the engine logs
such a change as a WARNING with the old and new numbers.

Pure: no I/O, no clock.
"""

from dataclasses import dataclass
from enum import StrEnum

from tidegate.api.admission import (
    FALLBACK_MAX_CONCURRENCY,
    FALLBACK_TOKEN_BUDGET,
    VLLM_DEFAULT_MAX_NUM_SEQS,
    AdmissionSpec,
)
from tidegate.api.serving import Engine as BackendEngine
from tidegate.api.serving import ModelSpec


@dataclass(frozen=True, slots=True)
class BackendCapacity:
    """What the model server can hold at once, as it reports it (``None``: not reported).

    ``kv_tokens``: KV-cache tokens it holds in total (vLLM ``num_gpu_blocks`` x ``block_size``, TGI
    ``max_batch_total_tokens``); ``slots``: sequences it runs at once (llama.cpp ``--parallel``);
    ``context_tokens``: tokens one sequence may hold (llama.cpp per-slot ``n_ctx``, TGI
    ``max_total_tokens``); ``max_requests``: requests it accepts at once, refusing more (TGI
    ``max_concurrent_requests``). Sources per engine: :mod:`tidegate.admission.telemetry`.
    """

    kv_tokens: int | None = None
    slots: int | None = None
    context_tokens: int | None = None
    max_requests: int | None = None


class Source(StrEnum):
    """Where a number in force came from (``token_budget_source`` in the stats)."""

    CONFIGURED = "configured"  # the pool's spec sets it
    ENGINE = "engine"  # the model server reported it (or, vLLM concurrency, its documented default)
    PENDING = "pending"  # not read yet: the replica does not serve
    FALLBACK = "fallback"  # the model server reported nothing in time: a conservative default


REPORTING_ENGINES = frozenset({BackendEngine.VLLM, BackendEngine.LLAMACPP, BackendEngine.TGI})
"""Engines whose capacity the sidecar reads; ``openai`` reports none."""


@dataclass(frozen=True, slots=True)
class Sizing:
    """The numbers in force and their sources (:attr:`token_budget` is the adaptive budget's base)."""

    token_budget: int
    max_concurrency: int
    budget_source: Source
    concurrency_source: Source

    @property
    def pending(self) -> bool:
        """Whether a number the replica needs is still unknown (do not serve yet)."""
        return Source.PENDING in (self.budget_source, self.concurrency_source)

    @property
    def fallback(self) -> bool:
        """Whether a number is a fallback because the model server reported none."""
        return Source.FALLBACK in (self.budget_source, self.concurrency_source)


def engine_token_budget(capacity: BackendCapacity | None) -> int | None:
    """KV-cache tokens the server holds: its own total, else slots x context per slot; None: unknown."""
    if capacity is None:
        return None
    if capacity.kv_tokens is not None:
        return capacity.kv_tokens
    if capacity.slots is not None and capacity.context_tokens is not None:
        return capacity.slots * capacity.context_tokens
    return None


def engine_max_concurrency(engine: BackendEngine, capacity: BackendCapacity | None) -> int | None:
    """Sequences the server runs (llama.cpp slots) or requests it accepts (TGI); vLLM's default
    ``--max-num-seqs`` once it has reported its KV cache (it publishes no sequence limit); None: unknown."""
    if capacity is None:
        return None
    if capacity.slots is not None:
        return capacity.slots
    if capacity.max_requests is not None:
        return capacity.max_requests
    if engine is BackendEngine.VLLM and capacity.kv_tokens is not None:
        return VLLM_DEFAULT_MAX_NUM_SEQS
    return None


def size(admission: AdmissionSpec, model: ModelSpec, capacity: BackendCapacity | None, *, waited_out: bool) -> Sizing:
    """The sizing in force (module docstring). ``waited_out``: the bounded wait for the model
    server's capacity is over (ignored for engines that report none: they fall back at once)."""
    give_up = waited_out or model.engine not in REPORTING_ENGINES
    budget, budget_source = admission.token_budget, Source.CONFIGURED
    if budget is None:
        budget, budget_source = engine_token_budget(capacity), Source.ENGINE
        if budget is None:
            budget = max(FALLBACK_TOKEN_BUDGET, model.max_context_tokens)
            budget_source = Source.FALLBACK if give_up else Source.PENDING
    concurrency, concurrency_source = admission.max_concurrency, Source.CONFIGURED
    if concurrency is None:
        concurrency, concurrency_source = engine_max_concurrency(model.engine, capacity), Source.ENGINE
        if concurrency is None:
            concurrency = FALLBACK_MAX_CONCURRENCY
            concurrency_source = Source.FALLBACK if give_up else Source.PENDING
    return Sizing(budget, concurrency, budget_source, concurrency_source)


def describe(sizing: Sizing, engine: BackendEngine) -> str | None:
    """One sentence for the log and ``config_warnings`` when a number is a fallback (else None)."""
    if not sizing.fallback:
        return None
    parts = []
    if sizing.budget_source is Source.FALLBACK:
        parts.append(f"admission.tokenBudget {sizing.token_budget}")
    if sizing.concurrency_source is Source.FALLBACK:
        parts.append(f"admission.maxConcurrency {sizing.max_concurrency}")
    why = (
        "engine 'openai' reports no capacity"
        if engine not in REPORTING_ENGINES
        else f"the {engine.value} server reported no capacity in time"
    )
    return f"{why}: running on the fallback {' and '.join(parts)}; set them in the pool's spec.admission"
