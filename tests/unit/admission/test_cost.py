"""Request cost: what a request reserves, and which bodies are refused before any decision."""

import math

import pytest

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
