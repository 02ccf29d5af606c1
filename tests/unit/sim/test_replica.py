"""The replica model, driven by explicit model times (a fake clock): what a user of a GPU would see."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.sim.replica import EventKind, PromptTooLong, ReplicaConfig, ReplicaModel, SeqState


def run_to_idle(model: ReplicaModel, limit_s: float = 1e6) -> list:
    events = []
    while model.next_event_s is not None:
        assert model.next_event_s < limit_s, "model never went idle"
        events += model.advance(model.next_event_s)
    return events


def test_a_lone_sequence_prefills_then_decodes_at_the_configured_rates() -> None:
    cfg = ReplicaConfig(prefill_tokens_per_s=20_000, decode_tokens_per_s=100)
    model = ReplicaModel(cfg)
    model.submit("a", prompt_tokens=1000, output_tokens=5, now_s=0.0)
    run_to_idle(model)
    seq = model.sequence("a")
    assert seq.ttft_s == pytest.approx(0.05)
    gaps = [b - a for a, b in zip(seq.token_times_s, seq.token_times_s[1:], strict=False)]
    assert gaps == pytest.approx([0.01] * 4)
    assert seq.state is SeqState.FINISHED and seq.finished_s == seq.token_times_s[-1]
    assert model.kv_used_tokens == 0 and model.num_running == 0


def test_ttft_grows_with_queueing_behind_a_full_batch() -> None:
    model = ReplicaModel(ReplicaConfig(max_running=2))
    for i in range(8):
        model.submit(i, prompt_tokens=100, output_tokens=50, now_s=0.0)
    assert model.num_waiting == 6
    run_to_idle(model)
    ttfts = [model.sequence(i).ttft_s for i in range(8)]
    assert ttfts == sorted(ttfts)
    # each later pair waits for the previous pair's whole generation (~50 decode steps)
    assert ttfts[7] - ttfts[0] > 3 * 49 * ReplicaConfig().decode_step_s(2)


def test_decode_slows_per_sequence_as_the_batch_grows() -> None:
    def token_gap(batch: int) -> float:
        model = ReplicaModel(ReplicaConfig(decode_tokens_per_s=100, batch_slowdown=0.05))
        for i in range(batch):
            model.submit(i, prompt_tokens=10, output_tokens=20, now_s=0.0)
        run_to_idle(model)
        times = model.sequence(0).token_times_s
        return times[-1] - times[-2]

    assert token_gap(1) == pytest.approx(0.01)
    assert token_gap(11) == pytest.approx(0.01 * 1.5)
    assert token_gap(21) == pytest.approx(0.01 * 2.0)


def test_aggregate_throughput_rises_with_batch_and_saturates() -> None:
    cfg = ReplicaConfig(decode_tokens_per_s=150, batch_slowdown=0.01, max_running=4096)

    def throughput(batch: int) -> float:
        model = ReplicaModel(cfg)
        for i in range(batch):
            model.submit(i, prompt_tokens=1, output_tokens=200, now_s=0.0)
        run_to_idle(model)
        first = min(model.sequence(i).token_times_s[0] for i in range(batch))
        last = max(model.sequence(i).finished_s for i in range(batch))
        return batch * 199 / (last - first)

    rates = [throughput(b) for b in (1, 16, 64, 256, 1024)]
    assert rates == sorted(rates)
    assert rates[0] == pytest.approx(150, rel=0.01)
    ceiling = cfg.decode_tokens_per_s / cfg.batch_slowdown
    assert all(r < ceiling for r in rates)
    assert rates[-1] / rates[-2] < 1.3 < rates[1] / rates[0]  # 4x the batch buys little once saturated


def test_max_running_caps_the_batch_and_the_rest_wait() -> None:
    model = ReplicaModel(ReplicaConfig(max_running=3))
    for i in range(10):
        model.submit(i, prompt_tokens=5, output_tokens=5, now_s=0.0)
    while model.next_event_s is not None:
        assert model.num_running <= 3
        model.advance(model.next_event_s)
    assert all(model.sequence(i).state is SeqState.FINISHED for i in range(10))


def test_a_long_prompt_is_prefilled_in_chunks_while_decodes_continue() -> None:
    cfg = ReplicaConfig(prefill_tokens_per_s=10_000, decode_tokens_per_s=100, max_batched_tokens=1000)
    model = ReplicaModel(cfg)
    model.submit("short", prompt_tokens=10, output_tokens=50, now_s=0.0)
    model.advance(0.05)
    model.submit("long", prompt_tokens=5000, output_tokens=2, now_s=0.05)
    run_to_idle(model)
    short, long = model.sequence("short"), model.sequence("long")
    gaps = [b - a for a, b in zip(short.token_times_s, short.token_times_s[1:], strict=False)]
    # while "long" prefills, every step carries one decode + a 999-token chunk (~0.1 s), not one 0.5 s stall
    assert max(gaps) == pytest.approx(cfg.decode_step_s(1) + 999 / 10_000)
    assert long.ttft_s == pytest.approx(6 * cfg.decode_step_s(1) + 5000 / 10_000, rel=0.02)


def test_kv_pressure_preempts_the_newest_sequence_and_all_still_finish() -> None:
    model = ReplicaModel(ReplicaConfig(kv_capacity_tokens=120, max_model_len=100))
    for i in range(4):
        model.submit(i, prompt_tokens=20, output_tokens=60, now_s=0.0)
    events = []
    while model.next_event_s is not None:
        events += model.advance(model.next_event_s)
        assert 0 <= model.kv_usage <= 1
    assert model.preemptions_total > 0
    preempted = [e.seq_id for e in events if e.kind is EventKind.PREEMPTED]
    assert 0 not in preempted  # the oldest keeps running
    for i in range(4):
        seq = model.sequence(i)
        assert seq.state is SeqState.FINISHED and len(seq.token_times_s) == 60


def test_abort_frees_the_kv_cache_at_once() -> None:
    model = ReplicaModel()
    model.submit("x", prompt_tokens=1000, output_tokens=1000, now_s=0.0)
    model.advance(0.5)
    assert model.kv_used_tokens > 1000
    assert model.abort("x", now_s=0.5) is True
    assert model.kv_used_tokens == 0 and model.num_running == 0
    assert model.abort("x", now_s=0.6) is False
    assert model.next_event_s is None or model.advance(model.next_event_s) == []


def test_requests_over_the_context_are_refused() -> None:
    model = ReplicaModel(ReplicaConfig(kv_capacity_tokens=1000))
    with pytest.raises(PromptTooLong, match="maximum context length is 1000"):
        model.submit("big", prompt_tokens=900, output_tokens=101, now_s=0.0)
    with pytest.raises(ValueError, match="max_model_len"):
        ReplicaConfig(kv_capacity_tokens=1000, max_model_len=2000)


_ops = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=0.5),  # gap since the previous operation (s)
        st.integers(min_value=1, max_value=60),  # prompt tokens
        st.integers(min_value=1, max_value=40),  # output tokens
        st.booleans(),  # abort an earlier sequence instead of submitting
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, capacity=st.integers(min_value=100, max_value=400), max_running=st.integers(1, 8))
def test_kv_never_overflows_and_every_sequence_ends_exactly_once(ops, capacity, max_running) -> None:
    model = ReplicaModel(ReplicaConfig(kv_capacity_tokens=capacity, max_model_len=100, max_running=max_running))
    now, submitted, aborted, events = 0.0, [], set(), []
    for i, (gap, prompt, output, abort) in enumerate(ops):
        now += gap
        if abort and submitted:
            victim = submitted[i % len(submitted)]
            if model.abort(victim, now):
                aborted.add(victim)
        else:
            model.submit(i, prompt, output, now)
            submitted.append(i)
        events += model.advance(now)
        assert model.kv_used_tokens <= capacity and model.num_running <= max_running
    while model.next_event_s is not None:
        events += model.advance(model.next_event_s)
        assert model.kv_used_tokens <= capacity
    assert model.kv_used_tokens == 0 and model.num_running == 0 and model.num_waiting == 0
    finished = [e.seq_id for e in events if e.kind is EventKind.FINISHED]
    assert sorted(finished) == sorted(set(submitted) - aborted)  # once each; aborted never finish
    for sid in set(submitted) - aborted:
        seq = model.sequence(sid)
        assert len(seq.token_times_s) == seq.output_tokens
        assert seq.token_times_s == sorted(seq.token_times_s) and seq.first_token_s >= seq.arrival_s
        tokens = [e.index for e in events if e.kind is EventKind.TOKEN and e.seq_id == sid]
        assert tokens == list(range(seq.output_tokens))
    assert model.generation_tokens_total == sum(1 for e in events if e.kind is EventKind.TOKEN)
    assert math.isclose(model.kv_usage, 0.0)


def test_the_waiting_gauge_counts_only_what_the_last_step_could_not_schedule() -> None:
    """vLLM logs ``num_requests_waiting`` from each step's scheduler stats: a request that arrives
    mid-step and fits the next step never shows as waiting (the sidecar would hold work on it)."""
    model = ReplicaModel(ReplicaConfig(max_running=2, decode_tokens_per_s=10))
    model.submit("a", prompt_tokens=10, output_tokens=50, now_s=0.0)
    model.advance(0.05)  # mid-step
    model.submit("b", prompt_tokens=10, output_tokens=50, now_s=0.05)
    assert model.num_waiting == 1 and model.reported_waiting == 0  # it fits the next step
    model.submit("c", prompt_tokens=10, output_tokens=50, now_s=0.05)
    model.advance(model.next_event_s)  # the next step schedules b; c does not fit (max_running 2)
    assert (model.reported_running, model.reported_waiting) == (2, 1)
