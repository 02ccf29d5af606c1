"""The token cost of one OpenAI request: prompt tokens + reserved output tokens.

Invariants (what the engine relies on):

- ``reserved_tokens >= 1`` and is never below what the backend may actually hold for the request:
  the output reservation is the largest declared cap (``max_tokens``, ``max_completion_tokens``)
  per sequence, times the sequences generated (``max(n, best_of)``) and the prompts sent, and
  defaults to the context left after the prompt; it is clamped to the context left, which is
  what vLLM itself enforces (``prompt + max_tokens <= --max-model-len``).
- The safety factor covers tokenizer *estimate* error, so it multiplies the estimated prompt
  tokens only: an exact prompt count and the declared output caps are exact upper bounds, and
  over-reserving them would waste budget (a request with ``max_completion_tokens: 10000`` holds
  exactly 10000 output tokens).
- A malformed body is a :class:`CostError` with reason ``bad_request``; a prompt that cannot fit
  the context window is ``request_too_large``. Both are final (no retry helps).

Estimate (``tokenizer: estimate``): characters of every string in the prompt divided by
``estimateCharsPerToken`` (default 3: English BPE averages about 4, code and CJK fewer), plus 4
tokens per chat message for the chat template, plus a flat :data:`IMAGE_TOKENS` per image part
(images are sent as URLs or base64 whose length says nothing about their token count). The
context-overflow check uses a *lower bound* (:data:`MAX_CHARS_PER_TOKEN` characters per token) so
that an over-estimate never refuses a prompt the backend would accept; the backend's own 400 covers
the grey zone.

Pure: no I/O.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidegate.admission.reasons import Reason

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
MESSAGE_OVERHEAD_TOKENS = 4
"""Tokens a chat template adds per message (role markers, separators); OpenAI's cookbook counts 3-4."""
IMAGE_TOKENS = 1024
"""Flat prompt-token guess for one image part (vision encoders use ~256-2500 tokens per image)."""
MAX_CHARS_PER_TOKEN = 8.0
"""No common tokenizer averages more characters per token than this: the lower-bound estimate."""


class CostError(Exception):
    """A request the engine must refuse before any decision: malformed, or never fits the context.

    ``reason`` is :attr:`Reason.BAD_REQUEST` or :attr:`Reason.REQUEST_TOO_LARGE`; ``param`` names
    the offending field (the OpenAI error body's ``param``); ``code`` is the OpenAI error code.
    """

    def __init__(self, reason: Reason, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class RequestCost:
    """Tokens one request may hold in the backend's KV cache.

    ``prompt_tokens``: exact count or estimate (see ``prompt_exact``). ``output_tokens``: the
    output reservation over all sequences and prompts. ``reserved_tokens``: what admission holds
    (prompt over-reserved by the safety factor when estimated, plus output).
    """

    prompt_tokens: int
    output_tokens: int
    reserved_tokens: int
    prompt_exact: bool = False
    sequences: int = 1
    stream: bool = False
    include_usage: bool = False

    @classmethod
    def fixed(cls, prompt_tokens: int, output_tokens: int) -> "RequestCost":
        """A cost given directly (tests, the simulator): exact prompt, no safety factor."""
        return cls(prompt_tokens, output_tokens, max(1, prompt_tokens + output_tokens), prompt_exact=True)


def _positive_int(body: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CostError(Reason.BAD_REQUEST, f"'{key}' must be an integer >= 1, got {value!r}", param=key)
    return value


def _string_chars(value: Any, images: list[int]) -> int:
    """Characters of every string inside ``value``; image parts are counted in ``images``."""
    if isinstance(value, str):
        return 0 if value.startswith("data:") else len(value)
    if isinstance(value, Mapping):
        if value.get("type") in ("image_url", "input_image", "image"):
            images[0] += 1
            return 0
        return sum(_string_chars(v, images) for v in value.values())
    if isinstance(value, list):
        return sum(_string_chars(v, images) for v in value)
    return 0


def _chat_prompt_chars(body: Mapping[str, Any]) -> tuple[int, int, int]:
    """(characters, fixed tokens, images) of a chat request's prompt, validating ``messages``."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise CostError(Reason.BAD_REQUEST, "'messages' must be a non-empty array", param="messages")
    images = [0]
    chars = 0
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise CostError(
                Reason.BAD_REQUEST, f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise CostError(
                Reason.BAD_REQUEST, f"messages[{i}].content must be a string or an array", param=f"messages[{i}]"
            )
        chars += _string_chars(message, images)
    for key in ("tools", "functions", "response_format"):
        chars += _string_chars(body.get(key), images)
    return chars, MESSAGE_OVERHEAD_TOKENS * len(messages) + 3, images[0]


def _completion_prompts(body: Mapping[str, Any]) -> list[tuple[int, int | None]]:
    """Per prompt: (characters, exact tokens when given as token ids)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [(len(prompt), None)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return [(0, len(prompt))]
        if all(isinstance(p, str) for p in prompt):
            return [(len(p), None) for p in prompt]
        if all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt):
            return [(0, len(p)) for p in prompt]
    raise CostError(
        Reason.BAD_REQUEST,
        "'prompt' must be a string, an array of strings, or an array of token ids",
        param="prompt",
    )


def of_body(
    path: str,
    body: Any,
    *,
    max_context_tokens: int,
    default_max_tokens: int | None,
    chars_per_token: float,
    safety_factor: float,
    prompt_tokens: int | None = None,
) -> RequestCost:
    """The cost of an OpenAI ``/v1/chat/completions`` or ``/v1/completions`` body (parsed JSON).

    ``prompt_tokens``: an exact count from a tokenizer (the backend's ``/tokenize``), else the
    prompt is estimated (module docstring). Raises :class:`CostError` (bad request, or a prompt
    that leaves no room for output in ``max_context_tokens``).
    """
    if not isinstance(body, Mapping):
        raise CostError(Reason.BAD_REQUEST, "the request body must be a JSON object")
    for key in ("model", "stream"):
        expected = str if key == "model" else bool
        if body.get(key) is not None and not isinstance(body[key], expected):
            raise CostError(Reason.BAD_REQUEST, f"'{key}' must be a {expected.__name__}", param=key)
    if path == CHAT_PATH:
        chars, overhead, images = _chat_prompt_chars(body)
        prompts = [(chars, None)]
        fixed_tokens = overhead + images * IMAGE_TOKENS
    elif path == COMPLETIONS_PATH:
        prompts = _completion_prompts(body)
        fixed_tokens = 0
    else:
        raise ValueError(f"not an admitted path: {path}")
    caps = [c for c in (_positive_int(body, "max_tokens"), _positive_int(body, "max_completion_tokens")) if c]
    n = _positive_int(body, "n", 1) or 1
    best_of = _positive_int(body, "best_of", n) or n
    sequences = max(n, best_of)

    exact = prompt_tokens is not None or all(tokens is not None for _, tokens in prompts)
    if prompt_tokens is not None:  # one exact count for all prompts together
        per_prompt = [(prompt_tokens // len(prompts), prompt_tokens // len(prompts))] * len(prompts)
    else:
        per_prompt = [
            (t, t)
            if t is not None
            else (math.ceil(c / chars_per_token) + fixed_tokens, math.ceil(c / MAX_CHARS_PER_TOKEN) + fixed_tokens)
            for c, t in prompts
        ]
    total_prompt = 0
    output = 0
    for estimate, lower in per_prompt:
        context_left = max_context_tokens - lower
        if context_left < 1:
            raise CostError(
                Reason.REQUEST_TOO_LARGE,
                f"the prompt ({lower} tokens) leaves no room for output in the {max_context_tokens}-token context",
                param="messages" if path == CHAT_PATH else "prompt",
                code="context_length_exceeded",
            )
        per_sequence = max(caps) if caps else (default_max_tokens or context_left)
        output += min(per_sequence, context_left) * sequences
        total_prompt += estimate
    prompt_reserved = total_prompt if exact else math.ceil(total_prompt * safety_factor)
    stream_options = body.get("stream_options")
    include_usage = isinstance(stream_options, Mapping) and stream_options.get("include_usage") is True
    return RequestCost(
        prompt_tokens=total_prompt,
        output_tokens=output,
        reserved_tokens=max(1, prompt_reserved + output),
        prompt_exact=exact,
        sequences=sequences,
        stream=body.get("stream") is True,
        include_usage=include_usage,
    )
