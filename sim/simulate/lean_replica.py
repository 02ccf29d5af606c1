"""A :class:`~tidegate.sim.replica.ReplicaModel` that reports only first tokens and finishes, and
runs stretches of identical decode steps without stepping through them one by one.

The simulator needs each sequence's first-token and finish times, not every token: the full
model spends most of a run building one ``Event`` per generated token and one simulator event
per engine step. This subclass changes how fast the model runs, never what it computes:

- **Lean emit.** TOKEN events only for each sequence's first token; ``token_times_s`` stays empty.
- **Silent runs.** A step that only decodes (no prefill chunk, every running sequence in the
  batch, the waiting queue blocked) is followed by steps identical to it until a sequence
  finishes, the KV cache would preempt, or a request arrives or is aborted: the batch, the step
  duration ``decode_step_s(B)`` and the gauges stay the same, and none of those step boundaries
  emits an event (no first token, no finish). :meth:`_start_step` counts how many such
  boundaries follow (the *run*); :meth:`_advance_to` crosses them with a few integer updates
  (``generation_tokens_total``, ``kv_used_tokens``) and defers the per-sequence counters
  (``generated``, ``kv_tokens``) to :meth:`_flush`; :attr:`next_event_s` is the end of the
  run's last step, so the simulator books one event per run instead of one per step. Step end
  times are summed one step at a time, as the parent does, so every time is bit-identical.
  :meth:`submit` and :meth:`abort` change what the next step would do, so they cut the run at
  the step in progress.

``tests/unit/simulate/test_lean_replica.py`` checks that both give identical first-token and
finish times, counters, gauges and preemptions on workloads with KV pressure and aborts; this
class must be kept in step with ``ReplicaModel._emit``, ``_start_step`` and ``_advance_to``.
"""

from collections.abc import Hashable, Iterator

from tidegate.sim.replica import Event, EventKind, ReplicaConfig, ReplicaModel, SeqState, Sequence


class LeanReplica(ReplicaModel):
    """Same model; TOKEN events only for each sequence's first token; identical decode steps in bulk."""

    def __init__(self, config: ReplicaConfig | None = None, start_s: float = 0.0) -> None:
        self._run_left = 0  # silent step boundaries still ahead in the current run
        self._lag = 0  # boundaries crossed whose per-sequence counters are not applied yet
        self._run_step_s = 0.0
        self._run_end_s: float | None = None
        super().__init__(config, start_s)

    # -- queries ---------------------------------------------------------------------------
    @property
    def next_event_s(self) -> float | None:
        return None if self._step is None else self._run_end_s

    def sequence(self, seq_id: Hashable) -> Sequence:
        self._flush()
        return super().sequence(seq_id)

    def sequences(self) -> Iterator[Sequence]:
        self._flush()
        return super().sequences()

    # -- commands --------------------------------------------------------------------------
    def submit(self, seq_id: Hashable, prompt_tokens: int, output_tokens: int, now_s: float) -> Sequence:
        self._advance_to(now_s)
        self._cut_run()
        return super().submit(seq_id, prompt_tokens, output_tokens, now_s)

    def abort(self, seq_id: Hashable, now_s: float) -> bool:
        self._advance_to(now_s)
        self._cut_run()
        return super().abort(seq_id, now_s)

    # -- engine ----------------------------------------------------------------------------
    def _advance_to(self, until_s: float) -> None:
        step = self._step
        while step is not None and step.end_s <= until_s:
            if self._run_left:
                # silent boundaries: each step's tokens are out and the next identical step reserves KV
                start, end, left, crossed, step_s = step.start_s, step.end_s, self._run_left, 0, self._run_step_s
                while left and end <= until_s:
                    start, end = end, end + step_s
                    left -= 1
                    crossed += 1
                batch = len(step.decodes)
                self.generation_tokens_total += batch * crossed
                self._kv_used += batch * crossed
                self._run_left, self._lag = left, self._lag + crossed
                step.start_s, step.end_s = start, end
                self._now = start
            else:
                self._now = step.end_s
                self._flush()
                self._finish_step(step)
                self._step = None
                self._start_step()
                step = self._step
        self._now = max(self._now, until_s)

    def _start_step(self) -> None:
        super()._start_step()
        step = self._step
        self._run_left = 0
        self._run_end_s = None if step is None else step.end_s
        if step is None or step.prefills or len(step.decodes) != len(self._running):
            return
        cfg = self.config
        batch = len(step.decodes)
        # boundaries with no finish: the step that emits a sequence's last token ends the run
        no_finish = min(s.output_tokens - s.generated for s in step.decodes) - 1
        # boundaries with no preemption: the next step's reservation must fit (ReplicaModel._start_step)
        no_preempt = (cfg.kv_capacity_tokens - self._kv_used) // batch
        self._run_left = max(0, min(no_finish, no_preempt))
        if self._run_left:
            self._run_step_s = cfg.decode_step_s(batch)  # the parent adds 0.0 of prefill: the same float
            end = step.end_s
            for _ in range(self._run_left):
                end = end + self._run_step_s
            self._run_end_s = end

    def _flush(self) -> None:
        """Apply the deferred per-sequence counters of the silent boundaries crossed so far."""
        if self._lag and self._step is not None:
            for seq in self._step.decodes:
                seq.generated += self._lag
                seq.kv_tokens += self._lag
        self._lag = 0

    def _cut_run(self) -> None:
        """End the run at the step in progress: what comes after it must be decided afresh."""
        self._flush()
        self._run_left = 0
        self._run_end_s = None if self._step is None else self._step.end_s

    def _emit(self, seq: Sequence) -> None:
        t = self._now
        if seq.first_token_s is None:
            seq.first_token_s = t
            self.prompt_tokens_total += seq.prompt_tokens
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
