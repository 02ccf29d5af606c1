"""Tokenizer, clock, fault switches and request parsing of the sim-backend (pure)."""

import pytest

from tidegate.sim import faults, protocol, tokenizer
from tidegate.sim.clock import ScaledClock


class FakeWall:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_tokenizer_counts_four_characters_per_token_and_output_round_trips() -> None:
    assert tokenizer.count("") == 0
    assert tokenizer.count("abcd") == 1
    assert tokenizer.count("abcde") == 2
    assert tokenizer.tokenize("hello world!") == tokenizer.tokenize("hello world!")  # deterministic
    assert len(tokenizer.tokenize("x" * 4001)) == tokenizer.count("x" * 4001) == 1001
    text = "".join(tokenizer.output_texts(0, 37))
    assert tokenizer.count(text) == 37
    chat = tokenizer.render_chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert chat == "<|user|>\nhi\n<|assistant|>\n"
    with pytest.raises(tokenizer.PromptError):
        tokenizer.render_chat([])
    with pytest.raises(tokenizer.PromptError):
        tokenizer.render_chat([{"content": "no role"}])
    assert tokenizer.prompt_tokens([1, 2, 3]) == 3
    with pytest.raises(tokenizer.PromptError):
        tokenizer.prompt_tokens(["a", "b"])


def test_clock_scales_slows_and_stalls_without_jumping() -> None:
    wall = FakeWall()
    clock = ScaledClock(wall, time_scale=10)
    wall.t += 1
    assert clock.now() == pytest.approx(10)
    clock.set_pace(slowdown=2, stalled=False)
    wall.t += 1
    assert clock.now() == pytest.approx(15)
    assert clock.wall_delay(20) == pytest.approx(1)
    clock.set_pace(slowdown=2, stalled=True)
    wall.t += 50
    assert clock.now() == pytest.approx(15) and clock.wall_delay(20) is None
    clock.set_pace(slowdown=1, stalled=False)
    wall.t += 0.5
    assert clock.now() == pytest.approx(20)  # the stall is not caught up
    with pytest.raises(ValueError):
        ScaledClock(wall, time_scale=0)


def test_fault_patches_change_only_what_they_name() -> None:
    state = faults.apply(faults.Faults(), {"stall": True, "error_rate": 0.5})
    state = faults.apply(state, {"slowdown": 3})
    assert (state.stall, state.error_rate, state.slowdown) == (True, 0.5, 3.0)
    state = faults.apply(state, {"freeze_metrics": {"kv_cache_usage_perc": 0.99}})
    assert state.freeze_metrics == {"kv_cache_usage_perc": 0.99}
    assert faults.apply(state, {"clear": True}) == faults.Faults()
    assert faults.apply(state, {"clear": True, "reject_rate": 1}) == faults.Faults(reject_rate=1.0)
    for bad in ({"error_rate": 2}, {"stall": "yes"}, {"slowdown": 0}, {"nope": 1}, {"freeze_metrics": {"x": 1}}):
        with pytest.raises(faults.FaultError):
            faults.apply(faults.Faults(), bad)


def test_fault_flags_parse_like_the_json_patches() -> None:
    assert faults.parse_flag("stall") == {"stall": True}
    assert faults.parse_flag("slowdown=2.5") == {"slowdown": 2.5}
    assert faults.parse_flag("error-rate=0.1") == {"error_rate": 0.1}
    assert faults.parse_flag("freeze_metrics=kv_cache_usage_perc:0.99") == {
        "freeze_metrics": {"kv_cache_usage_perc": 0.99}
    }
    with pytest.raises(faults.FaultError):
        faults.parse_flag("slowdown")
    with pytest.raises(faults.FaultError):
        faults.parse_flag("error_rate=lots")


def test_output_length_follows_the_caps_like_vllm() -> None:
    def plan(kind: str, body: dict) -> tuple[int, str]:
        return protocol.parse(kind, body, "m").plan(max_model_len=1000, default_max_tokens=100)

    msgs = [{"role": "user", "content": "hi"}]
    assert plan("chat", {"messages": msgs}) == (100, "stop")
    assert plan("chat", {"messages": msgs, "max_tokens": 7}) == (7, "length")
    assert plan("chat", {"messages": msgs, "max_tokens": 1, "max_completion_tokens": 9}) == (9, "length")
    assert plan("chat", {"messages": msgs, "max_tokens": 9, "sim_output_tokens": 3}) == (3, "stop")
    assert plan("completion", {"prompt": "hi"}) == (16, "length")  # vLLM's completions default
    assert plan("completion", {"prompt": "x" * 3980, "max_tokens": None}) == (5, "stop")  # context left


@pytest.mark.parametrize(
    ("kind", "body", "error"),
    [
        ("chat", [], protocol.BadRequest),
        ("chat", {}, protocol.BadRequest),
        ("chat", {"messages": "hi"}, protocol.BadRequest),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, protocol.BadRequest),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}, protocol.BadRequest),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "stream_options": {}}, protocol.BadRequest),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "model": "other"}, protocol.ModelNotFound),
        ("completion", {"prompt": {"a": 1}}, protocol.BadRequest),
    ],
)
def test_malformed_requests_are_refused_with_the_openai_error_shape(kind, body, error) -> None:
    with pytest.raises(error) as info:
        protocol.parse(kind, body, "m")
    assert set(info.value.body()["error"]) == {"message", "type", "param", "code"}
