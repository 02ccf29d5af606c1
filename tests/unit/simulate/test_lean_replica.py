"""The lean replica must be the replica model, minus per-token events."""

import numpy as np

from tidegate.sim.replica import EventKind, ReplicaConfig, ReplicaModel
from tidegate.sim.simulate.lean_replica import LeanReplica


def _drive(model: ReplicaModel) -> dict[int, tuple[float | None, float | None]]:
    rng = np.random.default_rng(11)
    t = 0.0
    for i in range(400):
        t += float(rng.exponential(0.05))
        model.submit(i, int(rng.integers(50, 3000)), int(rng.integers(1, 300)), t)
        model.advance(t)
    while model.next_event_s is not None:
        model.advance(model.next_event_s)
    return {s.seq_id: (s.first_token_s, s.finished_s) for s in model.sequences()}


def test_same_times_counters_and_preemptions_as_the_full_model() -> None:
    cfg = ReplicaConfig(kv_capacity_tokens=20_000, max_model_len=8_000)  # KV pressure: preemptions happen
    full, lean = ReplicaModel(cfg), LeanReplica(cfg)
    assert _drive(full) == _drive(lean)
    assert full.preemptions_total == lean.preemptions_total > 0
    for name in ("finished_total", "generation_tokens_total", "prompt_tokens_total"):
        assert getattr(full, name) == getattr(lean, name)


def test_lean_reports_each_first_token_once() -> None:
    lean = LeanReplica()
    lean.submit("a", 100, 50, 0.0)
    events = lean.advance(100.0)
    assert [e.kind for e in events] == [EventKind.SCHEDULED, EventKind.TOKEN, EventKind.FINISHED]
