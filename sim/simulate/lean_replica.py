"""A :class:`~tidegate.sim.replica.ReplicaModel` that reports only first tokens and finishes.

The simulator needs each sequence's first-token and finish times, not every token: the full
model spends most of a run building one ``Event`` and one list entry per generated token. This
subclass overrides the emit step only; scheduling, KV accounting, preemption and every counter are
the parent's. ``tests/unit/simulate/test_lean_replica.py`` checks that both give identical
first-token and finish times, counters and preemptions on a workload with KV pressure; it must be
kept in step with ``ReplicaModel._emit``.
"""

from tidegate.sim.replica import Event, EventKind, ReplicaModel, SeqState, Sequence


class LeanReplica(ReplicaModel):
    """Same model; TOKEN events only for each sequence's first token; ``token_times_s`` stays empty."""

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
