"""Request cost: what a request reserves, and which bodies are refused before any decision."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.admission import cost
from tidegate.admission.cost import CHAT_PATH, COMPLETIONS_PATH, CostError
from tidegate.admission.reasons import Reason


def chat_cost(body: dict, **kw: object) -> cost.RequestCost:
    args = {"max_context_tokens": 32768, "default_max_tokens": None, "chars_per_token": 3.0, "safety_factor": 1.0}
    args.update(kw)
    return cost.of_body(CHAT_PATH, body, **args)  # type: ignore[arg-type]


def msgs(text: str = "hello") -> list[dict]:
    return [{"role": "user", "content": text}]


def test_largest_declared_cap_is_reserved() -> None:
    c = chat_cost({"messages": msgs(), "max_tokens": 1, "max_completion_tokens": 10000})
    assert c.output_tokens == 10000
    assert c.reserved_tokens == c.prompt_tokens + 10000


def test_every_sequence_is_reserved() -> None:
    c = chat_cost({"messages": msgs(), "max_tokens": 100, "n": 2})
    assert c.output_tokens == 200
    c = cost.of_body(
        COMPLETIONS_PATH,
        {"prompt": "hi", "max_tokens": 100, "n": 2, "best_of": 5},
        max_context_tokens=32768, default_max_tokens=None, chars_per_token=3.0, safety_factor=1.0,
    )  # fmt: skip
    assert c.output_tokens == 500


def test_no_cap_reserves_the_context_left_or_the_model_default() -> None:
    c = chat_cost({"messages": msgs("x" * 300)}, max_context_tokens=4096)
    assert c.output_tokens == 4096 - math.ceil(300 / cost.MAX_CHARS_PER_TOKEN) - (cost.MESSAGE_OVERHEAD_TOKENS + 3)
    assert chat_cost({"messages": msgs()}, default_max_tokens=256).output_tokens == 256


def test_caps_are_clamped_to_the_context_left() -> None:
    c = cost.of_body(
        COMPLETIONS_PATH, {"prompt": list(range(1000)), "max_tokens": 50_000},
        max_context_tokens=4096, default_max_tokens=None, chars_per_token=3.0, safety_factor=1.0,
    )  # fmt: skip
    assert c.prompt_exact and c.prompt_tokens == 1000 and c.output_tokens == 3096


def test_safety_factor_covers_estimated_prompts_only() -> None:
    plain = chat_cost({"messages": msgs("y" * 3000), "max_tokens": 10})
    padded = chat_cost({"messages": msgs("y" * 3000), "max_tokens": 10}, safety_factor=1.5)
    assert padded.reserved_tokens == math.ceil(plain.prompt_tokens * 1.5) + 10
    exact = chat_cost({"messages": msgs("y" * 3000), "max_tokens": 10}, safety_factor=1.5, prompt_tokens=700)
    assert exact.reserved_tokens == 710


def test_estimate_counts_text_not_image_bytes() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 500_000}}
    c = chat_cost(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "abc"}, image]}], "max_tokens": 1}
    )
    assert cost.IMAGE_TOKENS < c.prompt_tokens < cost.IMAGE_TOKENS + 20


def test_prompt_over_the_context_never_fits() -> None:
    with pytest.raises(CostError) as err:
        cost.of_body(
            COMPLETIONS_PATH, {"prompt": list(range(5000))},
            max_context_tokens=4096, default_max_tokens=None, chars_per_token=3.0, safety_factor=1.0,
        )  # fmt: skip
    assert err.value.reason is Reason.REQUEST_TOO_LARGE
    assert err.value.code == "context_length_exceeded"


def test_estimate_never_refuses_what_the_backend_might_accept() -> None:
    # 20k characters estimate at 3 chars/token = 6667 tokens > 4096, but could be 2500 real tokens
    c = chat_cost({"messages": msgs("z" * 20_000)}, max_context_tokens=4096)
    assert c.output_tokens >= 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([1, 2], None),
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0]"),
        ({"messages": msgs(), "max_tokens": "10"}, "max_tokens"),
        ({"messages": msgs(), "max_tokens": 0}, "max_tokens"),
        ({"messages": msgs(), "max_tokens": True}, "max_tokens"),
        ({"messages": msgs(), "n": -1}, "n"),
        ({"messages": msgs(), "stream": "yes"}, "stream"),
        ({"messages": msgs(), "model": 7}, "model"),
    ],
)
def test_malformed_chat_bodies_are_bad_requests(body: object, param: str | None) -> None:
    with pytest.raises(CostError) as err:
        chat_cost(body)  # type: ignore[arg-type]
    assert err.value.reason is Reason.BAD_REQUEST
    assert err.value.param == param


@pytest.mark.parametrize("prompt", [None, 5, [], [1, "a"], [[]], {"a": 1}])
def test_malformed_prompts_are_bad_requests(prompt: object) -> None:
    with pytest.raises(CostError) as err:
        cost.of_body(
            COMPLETIONS_PATH, {"prompt": prompt},
            max_context_tokens=4096, default_max_tokens=None, chars_per_token=3.0, safety_factor=1.0,
        )  # fmt: skip
    assert err.value.reason is Reason.BAD_REQUEST and err.value.param == "prompt"


def test_stream_flags_are_read() -> None:
    c = chat_cost({"messages": msgs(), "stream": True, "stream_options": {"include_usage": True}})
    assert c.stream and c.include_usage
    assert not chat_cost({"messages": msgs(), "stream": True}).include_usage


def completions_cost(body: dict, **kw: object) -> cost.RequestCost:
    args = {"max_context_tokens": 32768, "default_max_tokens": None, "chars_per_token": 3.0, "safety_factor": 1.0}
    args.update(kw)
    return cost.of_body(COMPLETIONS_PATH, body, **args)  # type: ignore[arg-type]


def test_llamacpp_n_predict_over_a_smaller_max_tokens_is_reserved() -> None:
    # llama.cpp reads n_predict before its aliases max_completion_tokens / max_tokens
    c = completions_cost({"prompt": "Count:", "max_tokens": 4, "n_predict": 300, "ignore_eos": True})
    assert c.output_tokens >= 300


def test_llamacpp_n_predict_minus_one_reserves_the_context_left() -> None:
    c = completions_cost({"prompt": list(range(100)), "max_tokens": 4, "n_predict": -1}, max_context_tokens=2048)
    assert c.output_tokens == 2048 - 100 and c.reserved_tokens == 2048


def test_llamacpp_n_cmpl_counts_its_completions() -> None:
    c = completions_cost({"prompt": list(range(10)), "max_tokens": 2, "n_cmpl": 2})
    assert c.sequences == 2 and c.output_tokens == 4
    assert completions_cost({"prompt": "x", "max_tokens": 2, "n": 3, "n_cmpl": 3}).sequences == 3


def test_tgi_max_new_tokens_is_a_cap() -> None:
    assert completions_cost({"prompt": "x", "max_tokens": 5, "max_new_tokens": 700}).output_tokens == 700


def test_min_tokens_is_a_floor_per_sequence() -> None:
    c = chat_cost({"messages": msgs(), "min_tokens": 900, "n": 2}, default_max_tokens=256)
    assert c.output_tokens == 1800


def test_ignore_eos_without_a_cap_reserves_the_context_left_not_the_default() -> None:
    c = completions_cost(
        {"prompt": list(range(96)), "ignore_eos": True}, max_context_tokens=4096, default_max_tokens=64
    )
    assert c.output_tokens == 4000
    assert completions_cost({"prompt": list(range(96))}, default_max_tokens=64).output_tokens == 64


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 4, "min_tokens": 5}, "min_tokens"),
        ({"max_tokens": 100, "max_completion_tokens": 4, "min_tokens": 5}, "min_tokens"),
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"n_cmpl": 3, "best_of": 2}, "best_of"),
        ({"n": 2, "n_cmpl": 3}, "n_cmpl"),
        ({"n_predict": -2}, "n_predict"),
        ({"n_predict": 1.5}, "n_predict"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_completion_tokens": -1}, "max_completion_tokens"),
        ({"max_tokens": 4.5}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"n_cmpl": 0}, "n_cmpl"),
        ({"best_of": True}, "best_of"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"use_beam_search": 1}, "use_beam_search"),
    ],
)
def test_inconsistent_output_fields_are_bad_requests_naming_the_field(body: dict, param: str) -> None:
    with pytest.raises(CostError) as err:
        completions_cost({"prompt": "hi", **body})
    assert err.value.reason is Reason.BAD_REQUEST and err.value.param == param
    assert param in err.value.message


def test_null_fields_are_absent() -> None:
    c = completions_cost(
        {"prompt": list(range(8)), "max_tokens": None, "n_predict": None, "n": None}, default_max_tokens=9
    )
    assert c.output_tokens == 9 and c.sequences == 1


def test_a_request_without_max_tokens_never_reserves_more_than_the_context() -> None:
    # estimate x safety factor + the context left after the prompt's lower bound used to reach 4098
    c = chat_cost({"messages": msgs("hello there, " * 20)}, max_context_tokens=4096, safety_factor=1.1)
    assert c.reserved_tokens <= 4096


def test_a_long_prompt_with_a_small_cap_is_held_to_the_context() -> None:
    words = " ".join(["tokenisation"] * 950)  # ~12k characters: estimated well over a 2048 context
    c = chat_cost({"messages": msgs(words), "max_tokens": 8}, max_context_tokens=2048, safety_factor=1.1)
    assert c.reserved_tokens == 2048


def test_the_context_cap_is_per_sequence_and_per_prompt() -> None:
    c = completions_cost({"prompt": ["y" * 9000, "z" * 9000], "n": 2}, max_context_tokens=2048, safety_factor=1.5)
    assert c.reserved_tokens == 2 * 2 * 2048


def test_an_exact_count_is_shared_out_to_the_token() -> None:
    c = completions_cost({"prompt": ["a", "b", "c"], "max_tokens": 1}, prompt_tokens=10)
    assert c.prompt_tokens == 10 and c.reserved_tokens == 13


caps = st.none() | st.integers(1, 50_000)


@settings(max_examples=300, deadline=None)
@given(
    prompt=st.integers(1, 9000),
    exact=st.booleans(),
    max_tokens=caps,
    max_new_tokens=caps,
    n_predict=st.none() | st.integers(-1, 50_000),
    min_tokens=st.none() | st.integers(0, 3000),
    n=st.integers(1, 4),
    ignore_eos=st.booleans(),
    context=st.sampled_from([512, 2048, 4096, 8192]),
    default=st.none() | st.integers(1, 512),
    safety=st.floats(1.0, 4.0),
)
def test_the_reservation_covers_every_server_and_never_exceeds_the_context_per_sequence(
    prompt: int, exact: bool, max_tokens: int | None, max_new_tokens: int | None, n_predict: int | None,
    min_tokens: int | None, n: int, ignore_eos: bool, context: int, default: int | None, safety: float,
) -> None:  # fmt: skip
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        min_tokens = max_tokens
    body = {"prompt": list(range(prompt)) if exact else "w" * prompt, "max_tokens": max_tokens, "n": n,
            "max_new_tokens": max_new_tokens, "n_predict": n_predict, "min_tokens": min_tokens, "ignore_eos": ignore_eos}  # fmt: skip
    try:
        c = completions_cost(body, max_context_tokens=context, default_max_tokens=default, safety_factor=safety)
    except CostError as err:
        lower = prompt if exact else math.ceil(prompt / cost.MAX_CHARS_PER_TOKEN)
        assert err.reason is Reason.REQUEST_TOO_LARGE and lower >= context
        return
    assert 1 <= c.reserved_tokens <= context * n
    if exact:  # the prompt is known: what the most generous of the three servers may hold is covered
        left = context - prompt
        declared = [v for v in (max_tokens, max_new_tokens, n_predict) if v is not None and v >= 0]
        if n_predict == -1 or (ignore_eos and not declared):
            per_sequence = left
        else:
            per_sequence = max(declared) if declared else (default or left)
        assert c.reserved_tokens >= prompt + n * min(max(per_sequence, min_tokens or 0), left)


@pytest.mark.parametrize("kind", [99, -1, 4, 1.5, "1"])
def test_a_grammar_trigger_of_an_unknown_type_is_a_bad_request(kind: object) -> None:
    """llama.cpp aborts the whole server on one (``GGML_ASSERT`` in ``common_sampler_init``)."""
    body = {
        "prompt": "hi",
        "max_tokens": 3,
        "grammar_triggers": [{"type": 0, "value": "x", "token": 5}, {"type": kind}],
    }
    with pytest.raises(CostError) as err:
        cost.of_body(
            COMPLETIONS_PATH, body, max_context_tokens=1024, default_max_tokens=None, chars_per_token=3.0,
            safety_factor=1.0,
        )  # fmt: skip
    assert err.value.reason is Reason.BAD_REQUEST and err.value.param == "grammar_triggers"


def test_grammar_triggers_of_known_types_pass() -> None:
    triggers = [{"type": t, "value": "x", "token": 5} for t in range(4)]
    for path, body in ((COMPLETIONS_PATH, {"prompt": "hi"}), (CHAT_PATH, {"messages": msgs()})):
        cost.of_body(
            path, {**body, "grammar_triggers": triggers}, max_context_tokens=1024, default_max_tokens=None,
            chars_per_token=3.0, safety_factor=1.0,
        )  # fmt: skip


@pytest.mark.parametrize("slot", [0, 1, 7, 0.5, True, "0"])
def test_pinning_a_llamacpp_slot_is_a_bad_request(slot: object) -> None:
    """``id_slot`` makes llama.cpp wait for that slot while another is free, which holds every tenant."""
    for path, body in ((COMPLETIONS_PATH, {"prompt": "hi"}), (CHAT_PATH, {"messages": msgs()})):
        with pytest.raises(CostError) as err:
            cost.of_body(
                path, {**body, "id_slot": slot}, max_context_tokens=1024, default_max_tokens=None,
                chars_per_token=3.0, safety_factor=1.0,
            )  # fmt: skip
        assert err.value.reason is Reason.BAD_REQUEST and err.value.param == "id_slot"


def test_no_slot_pinned_passes() -> None:
    for slot in (None, -1):
        cost.of_body(
            COMPLETIONS_PATH, {"prompt": "hi", "id_slot": slot}, max_context_tokens=1024, default_max_tokens=None,
            chars_per_token=3.0, safety_factor=1.0,
        )  # fmt: skip
