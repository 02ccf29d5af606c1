"""A pure model of one LLM serving replica with continuous batching (vLLM-like).

No I/O and no clock of its own: every call that changes state takes the model time ``now_s``
(seconds, any origin, never decreasing; an earlier time is treated as the model's current
time). The same object therefore runs behind the HTTP sim-backend (driven by a scaled wall
clock) and inside a discrete-event simulator (driven by the simulator's event times).

Engine steps (as vLLM's V1 scheduler, chunked prefill on, FCFS). A step's batch is fixed when
it starts: a sequence arriving while it runs waits for the next one (arrivals at the very
instant a step starts join it). At each step start:

1. Every running sequence past its prefill needs one more KV slot for its next token. If the
   KV cache cannot hold them, the most recently admitted running sequence is **preempted**
   (its KV is freed, it goes back to the front of the waiting queue and later recomputes
   prompt + tokens generated so far) until they fit.
2. Waiting sequences are admitted first-come first-served while fewer than ``max_running``
   run and the whole prefill (prompt + tokens generated before a preemption) fits in the free
   KV cache; the first one that does not fit blocks the rest (no overtaking).
3. The step's token budget (``max_batched_tokens``) goes first to one token per decoding
   sequence, the rest to prefill chunks in admission order.
4. Step duration ``= decode_step_s(B) + prefill_chunk_tokens / prefill_tokens_per_s`` where
   ``B`` is the number of decoding sequences and
   ``decode_step_s(B) = (1 + batch_slowdown * (B - 1)) / decode_tokens_per_s`` (0 when B = 0).
   So one sequence alone decodes at ``decode_tokens_per_s``; B of them each at
   ``decode_tokens_per_s / (1 + batch_slowdown * (B - 1))``; the aggregate rate
   ``B * decode_tokens_per_s / (1 + batch_slowdown * (B - 1))`` rises with B and saturates
   at ``decode_tokens_per_s / batch_slowdown``.
5. At the step's end every decoding sequence emits one token, and a sequence whose prefill
   completes emits its first token (its next one after a recompute). A sequence that has
   emitted its ``output_tokens`` finishes and frees its KV.

KV accounting is in tokens (no blocks): admission reserves the whole prefill; each decode step
reserves one more token. A sequence thus holds ``prefill + decoded - 1`` tokens at most, which
is below ``max_model_len <= kv_capacity_tokens``, so a sequence alone always fits and
``kv_used_tokens <= kv_capacity_tokens`` always holds.

Default figures: a Llama-3.1-8B-class model (BF16) on one H100 SXM 80 GB under vLLM; see
:class:`ReplicaConfig` for where each comes from and which are assumptions.

Errors (rooted at :class:`ReplicaError`): :class:`PromptTooLong` when a request can never be
served (prompt + output over ``max_model_len``); ``ValueError`` for bad arguments.
"""

import dataclasses
from collections import deque
from collections.abc import Hashable, Iterator
from enum import StrEnum
from typing import NamedTuple


class ReplicaError(Exception):
    """Root of the replica model's errors."""


class PromptTooLong(ReplicaError):
    """Prompt + requested output exceed the model's context (vLLM answers HTTP 400)."""


@dataclasses.dataclass(frozen=True)
class ReplicaConfig:
    """Capacity and speed of one replica. Defaults: Llama-3.1-8B (BF16), one H100 SXM 80 GB, vLLM V1.

    - ``decode_tokens_per_s`` = 150: one sequence alone. Roofline: 16.1 GB of weights read per
      step at 3.35 TB/s is ~208 steps/s; a measured H100 run of vLLM 0.21 at concurrency 1 gave
      TPOT p50 6.5 ms (~154 tokens/s; yobitelcomm.github.io/bench "concurrency sweep").
    - ``batch_slowdown`` = 0.01 (**assumption**): the extra step time per extra decoding
      sequence, as a fraction of the single-sequence step; mostly KV reads (128 KiB per token
      for this model, ~0.04 ms per 1k-token sequence per step at full bandwidth, ~0.6% of a
      6.5 ms step). Gives ~5.9k tokens/s at B = 64 and saturates at 15k tokens/s, in line
      with the ~12.5k tokens/s published for this model on one H100 (morphllm.com vLLM
      benchmarks, third-party) and the flat-then-rising TPOT of measured sweeps.
    - ``prefill_tokens_per_s`` = 20,000 (**assumption**): 2 x 8.0 G FLOP per token against
      989 TFLOP/s dense BF16 is ~62k tokens/s at full use; ~1/3 of that is typical, so a
      1k-token prompt alone costs ~50 ms.
    - ``kv_capacity_tokens`` = 400,000: (72 GB at ``gpu_memory_utilization`` 0.9 - 16 GB
      weights - ~4 GB activations) / 131,072 bytes per token (2 x 32 layers x 8 KV heads x 128
      x 2 bytes); vLLM reports ~543k tokens for the 94 GB H100 NVL.
    - ``max_running`` = 1024 and ``max_batched_tokens`` = 8192: vLLM V1's defaults for the
      OpenAI server on GPUs with >= 70 GiB that are not A100 (``EngineArgs`` batch defaults).
    - ``max_model_len``: the model's 131,072-token context, capped at the KV capacity (vLLM
      refuses to start when one full-length sequence cannot fit). ``None`` means that default.
    """

    prefill_tokens_per_s: float = 20_000.0
    decode_tokens_per_s: float = 150.0
    batch_slowdown: float = 0.01
    kv_capacity_tokens: int = 400_000
    max_running: int = 1024
    max_batched_tokens: int = 8192
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("prefill_tokens_per_s", "decode_tokens_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.batch_slowdown < 0:
            raise ValueError("batch_slowdown must be >= 0")
        for name in ("kv_capacity_tokens", "max_running", "max_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_model_len is None:
            object.__setattr__(self, "max_model_len", min(131_072, self.kv_capacity_tokens))
        if not 2 <= self.max_model_len <= self.kv_capacity_tokens:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) must be between 2 and kv_capacity_tokens "
                f"({self.kv_capacity_tokens}): one full-length sequence must fit in the KV cache"
            )

    def decode_step_s(self, batch: int) -> float:
        """Seconds of one decode step for ``batch`` decoding sequences (0 for an empty batch)."""
        if batch <= 0:
            return 0.0
        return (1.0 + self.batch_slowdown * (batch - 1)) / self.decode_tokens_per_s


class SeqState(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclasses.dataclass(eq=False)
class Sequence:
    """One sequence's record. Times are model seconds; ``token_times_s[i]`` is when token ``i`` was emitted."""

    seq_id: Hashable
    prompt_tokens: int
    output_tokens: int
    arrival_s: float
    state: SeqState = SeqState.WAITING
    generated: int = 0
    kv_tokens: int = 0
    prefill_len: int = 0
    prefilled: int = 0
    scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    preemptions: int = 0
    token_times_s: list[float] = dataclasses.field(default_factory=list)

    @property
    def ttft_s(self) -> float | None:
        """Time to first token (model seconds), ``None`` before it."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.prefill_len


class EventKind(StrEnum):
    SCHEDULED = "scheduled"  # first admission to the running batch (end of queueing)
    TOKEN = "token"  # ``index`` = 0-based index of the token emitted
    FINISHED = "finished"  # all output tokens emitted; KV released
    PREEMPTED = "preempted"  # evicted to make KV room; will recompute


class Event(NamedTuple):
    kind: EventKind
    seq_id: Hashable
    time_s: float
    index: int = -1


@dataclasses.dataclass
class _Step:
    start_s: float
    end_s: float
    decodes: list[Sequence]
    prefills: list[tuple[Sequence, int]]


class ReplicaModel:
    """Continuous-batching replica. Drive it with :meth:`submit`, :meth:`abort` and :meth:`advance`.

    :meth:`advance` returns, in time order, the :class:`Event` s produced since the previous call
    (including those produced while :meth:`submit` / :meth:`abort` caught the model up to their
    ``now_s``). :attr:`next_event_s` is when the step in progress ends (``None`` when idle): a
    driver sleeps until then.
    """

    def __init__(self, config: ReplicaConfig | None = None, start_s: float = 0.0) -> None:
        self.config = config or ReplicaConfig()
        self._now = start_s
        self._seqs: dict[Hashable, Sequence] = {}
        self._waiting: deque[Sequence] = deque()
        self._reported = (0, 0)  # (running, waiting) after the last scheduling step
        self._running: dict[Hashable, Sequence] = {}
        self._kv_used = 0
        self._step: _Step | None = None
        self._outbox: list[Event] = []
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.preemptions_total = 0
        self.finished_total = 0
        self.aborted_total = 0

    # -- queries ---------------------------------------------------------------------------
    @property
    def now_s(self) -> float:
        return self._now

    @property
    def next_event_s(self) -> float | None:
        return None if self._step is None else self._step.end_s

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def reported_running(self) -> int:
        """Running sequences as of the last scheduling step: what vLLM's gauge says (see :attr:`reported_waiting`)."""
        return self._reported[0]

    @property
    def reported_waiting(self) -> int:
        """Waiting sequences as of the last scheduling step, after that step scheduled what fit: what
        ``vllm:num_requests_waiting`` says. vLLM logs its gauges from the scheduler's stats of each
        step (``SchedulerStats``, v0.9+ V1 engine), so a request that arrived during a step and fits
        the next one never shows as waiting; :attr:`num_waiting` counts it until that step starts."""
        return self._reported[1]

    @property
    def kv_used_tokens(self) -> int:
        return self._kv_used

    @property
    def kv_usage(self) -> float:
        """Fraction (0..1) of the KV cache held by running sequences (``vllm:kv_cache_usage_perc``)."""
        return self._kv_used / self.config.kv_capacity_tokens

    def sequence(self, seq_id: Hashable) -> Sequence:
        """The record of a sequence not yet :meth:`release` d; ``KeyError`` otherwise."""
        return self._seqs[seq_id]

    def sequences(self) -> Iterator[Sequence]:
        return iter(self._seqs.values())

    # -- commands --------------------------------------------------------------------------
    def submit(self, seq_id: Hashable, prompt_tokens: int, output_tokens: int, now_s: float) -> Sequence:
        """Queue a sequence arriving at ``now_s`` that will emit exactly ``output_tokens`` tokens.

        Raises ``ValueError`` for a duplicate id or counts < 1, :class:`PromptTooLong` when
        ``prompt_tokens + output_tokens > max_model_len``.
        """
        if seq_id in self._seqs:
            raise ValueError(f"duplicate sequence id {seq_id!r}")
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("prompt_tokens and output_tokens must be >= 1")
        limit = self.config.max_model_len
        if prompt_tokens + output_tokens > limit:
            raise PromptTooLong(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + output_tokens} tokens ({prompt_tokens} in the messages, "
                f"{output_tokens} in the completion). Please reduce the length of the messages or completion."
            )
        self._advance_to(now_s)
        seq = Sequence(seq_id, prompt_tokens, output_tokens, arrival_s=self._now)
        self._seqs[seq_id] = seq
        self._waiting.append(seq)
        step = self._step
        if step is not None and step.start_s == self._now:
            # arrivals at the very instant a step starts join it, as a batch of simultaneous arrivals would
            for s in step.decodes:
                s.kv_tokens -= 1
            self._kv_used -= len(step.decodes)
            self._step = None
        if self._step is None:
            self._start_step()
        return seq

    def abort(self, seq_id: Hashable, now_s: float) -> bool:
        """Drop a waiting or running sequence at ``now_s`` and free its KV; ``False`` if it had ended."""
        self._advance_to(now_s)
        seq = self._seqs.get(seq_id)
        if seq is None or seq.state in (SeqState.FINISHED, SeqState.ABORTED):
            return False
        if seq.state is SeqState.WAITING:
            self._waiting.remove(seq)
        else:
            del self._running[seq_id]
            self._kv_used -= seq.kv_tokens
            seq.kv_tokens = 0
        seq.state = SeqState.ABORTED
        seq.finished_s = self._now
        self.aborted_total += 1
        return True

    def release(self, seq_id: Hashable) -> None:
        """Forget an ended sequence's record (long simulations call this to bound memory)."""
        seq = self._seqs.get(seq_id)
        if seq is not None and seq.state in (SeqState.FINISHED, SeqState.ABORTED):
            del self._seqs[seq_id]

    def advance(self, until_s: float) -> list[Event]:
        """Run every step that ends by ``until_s``; return the events since the previous call."""
        self._advance_to(until_s)
        events, self._outbox = self._outbox, []
        return events

    # -- engine ----------------------------------------------------------------------------
    def _advance_to(self, until_s: float) -> None:
        while self._step is not None and self._step.end_s <= until_s:
            self._now = self._step.end_s
            self._finish_step(self._step)
            self._step = None
            self._start_step()
        self._now = max(self._now, until_s)

    def _preempt(self, seq: Sequence) -> None:
        del self._running[seq.seq_id]
        self._kv_used -= seq.kv_tokens
        seq.kv_tokens = 0
        seq.prefill_len = seq.prefilled = 0
        seq.state = SeqState.WAITING
        seq.preemptions += 1
        self.preemptions_total += 1
        self._waiting.appendleft(seq)
        self._outbox.append(Event(EventKind.PREEMPTED, seq.seq_id, self._now))

    def _start_step(self) -> None:
        cfg = self.config
        decoding = [s for s in self._running.values() if not s.in_prefill]
        while self._kv_used + len(decoding) > cfg.kv_capacity_tokens:
            victim = self._running[next(reversed(self._running))]
            self._preempt(victim)
            if not victim.in_prefill and victim in decoding:
                decoding.remove(victim)
        while self._waiting and len(self._running) < cfg.max_running:
            seq = self._waiting[0]
            need = seq.prompt_tokens + seq.generated
            if self._kv_used + len(decoding) + need > cfg.kv_capacity_tokens:
                break
            self._waiting.popleft()
            seq.state = SeqState.RUNNING
            seq.prefill_len, seq.prefilled, seq.kv_tokens = need, 0, need
            self._kv_used += need
            self._running[seq.seq_id] = seq
            if seq.scheduled_s is None:
                seq.scheduled_s = self._now
                self._outbox.append(Event(EventKind.SCHEDULED, seq.seq_id, self._now))
        self._reported = (len(self._running), len(self._waiting))
        budget = cfg.max_batched_tokens
        decodes = decoding[:budget]
        for seq in decodes:
            seq.kv_tokens += 1
        self._kv_used += len(decodes)
        budget -= len(decodes)
        prefills: list[tuple[Sequence, int]] = []
        for seq in self._running.values():
            if budget <= 0:
                break
            if seq.in_prefill:
                chunk = min(seq.prefill_len - seq.prefilled, budget)
                prefills.append((seq, chunk))
                budget -= chunk
        if not decodes and not prefills:
            return
        duration = cfg.decode_step_s(len(decodes)) + sum(c for _, c in prefills) / cfg.prefill_tokens_per_s
        self._step = _Step(self._now, self._now + duration, decodes, prefills)

    def _emit(self, seq: Sequence) -> None:
        t = self._now
        if seq.first_token_s is None:
            seq.first_token_s = t
            self.prompt_tokens_total += seq.prompt_tokens
        seq.token_times_s.append(t)
        self._outbox.append(Event(EventKind.TOKEN, seq.seq_id, t, seq.generated))
        seq.generated += 1
        self.generation_tokens_total += 1
        if seq.generated >= seq.output_tokens:
            del self._running[seq.seq_id]
            self._kv_used -= seq.kv_tokens
            seq.kv_tokens = 0
            seq.state = SeqState.FINISHED
            seq.finished_s = t
            self.finished_total += 1
            self._outbox.append(Event(EventKind.FINISHED, seq.seq_id, t))

    def _finish_step(self, step: _Step) -> None:
        # A sequence aborted mid-step is no longer RUNNING; its share of the step is wasted, as on a GPU.
        for seq in step.decodes:
            if seq.state is SeqState.RUNNING:
                self._emit(seq)
        for seq, chunk in step.prefills:
            if seq.state is SeqState.RUNNING:
                seq.prefilled += chunk
                if not seq.in_prefill:
                    self._emit(seq)
