"""The lean replica must be the replica model, minus per-token events and per-step bookkeeping."""

import numpy as np
import pytest

from tidegate.sim.replica import EventKind, ReplicaConfig, ReplicaModel
from tidegate.sim.simulate.lean_replica import LeanReplica

Trace = tuple[dict[int, tuple[float | None, float | None]], list[tuple[float, ...]]]


def _drive(model: ReplicaModel, seed: int = 11, abort_every: int = 0) -> Trace:
    """Poisson arrivals, some aborted; the gauges as a driver reads them at every arrival."""
    rng = np.random.default_rng(seed)
    t = 0.0
    gauges = []
    for i in range(400):
        t += float(rng.exponential(0.05))
        model.submit(i, int(rng.integers(50, 3000)), int(rng.integers(1, 300)), t)
        if abort_every and i % abort_every == 0 and i >= 10:
            model.abort(i - 7, t)
        if i % 5 == 0:
            t += float(rng.exponential(0.5))  # a lull: runs of pure decode steps
        model.advance(t)
        gauges.append(
            (model.kv_used_tokens, model.generation_tokens_total, model.reported_running, model.reported_waiting,
             model.num_running, model.num_waiting, model.next_event_s is None)
        )  # fmt: skip
    while model.next_event_s is not None:
        model.advance(model.next_event_s)
    return {s.seq_id: (s.first_token_s, s.finished_s) for s in model.sequences()}, gauges


@pytest.mark.parametrize(("seed", "abort_every"), [(11, 0), (12, 3), (13, 0)])
def test_same_times_gauges_counters_and_preemptions_as_the_full_model(seed: int, abort_every: int) -> None:
    cfg = ReplicaConfig(kv_capacity_tokens=20_000, max_model_len=8_000)  # KV pressure: preemptions happen
    full, lean = ReplicaModel(cfg), LeanReplica(cfg)
    assert _drive(full, seed, abort_every) == _drive(lean, seed, abort_every)
    assert full.preemptions_total == lean.preemptions_total > 0
    for name in ("finished_total", "aborted_total", "generation_tokens_total", "prompt_tokens_total"):
        assert getattr(full, name) == getattr(lean, name)


def test_a_lone_decode_is_one_simulator_event_not_one_per_token() -> None:
    full = ReplicaModel()
    full.submit("a", 100, 50, 0.0)
    full.advance(1e9)
    lean = LeanReplica()
    lean.submit("a", 100, 50, 0.0)
    lean.advance(0.01)  # past the prefill step: the first token is out, 49 identical decode steps remain
    assert lean.next_event_s == full.sequence("a").finished_s  # the driver wakes once, at the finish


def test_lean_reports_each_first_token_once() -> None:
    lean = LeanReplica()
    lean.submit("a", 100, 50, 0.0)
    events = lean.advance(100.0)
    assert [e.kind for e in events] == [EventKind.SCHEDULED, EventKind.TOKEN, EventKind.FINISHED]
