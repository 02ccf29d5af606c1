"""The token cost of one OpenAI request: prompt tokens + reserved output tokens.

Invariants (what the engine relies on):

- ``reserved_tokens >= 1`` and is never below what the backend may actually hold for the request:
  the output reservation is the largest output cap any of vLLM, llama.cpp or TGI could honour
  (table below), per sequence, times the sequences generated and the prompts sent, and defaults
  to the context left after the prompt; it is clamped to the context left, which is what the
  servers enforce (vLLM: ``prompt + max_tokens <= --max-model-len``; llama.cpp stops a slot when
  its context is full).
- ``reserved_tokens <= maxContextTokens x sequences x prompts``: one sequence can never hold more
  than the context window, so the prompt's safety factor never pushes a request past it. With
  ``tokenBudget == maxContextTokens`` a single full-context request is therefore admitted.
- The safety factor covers tokenizer *estimate* error, so it multiplies the estimated prompt
  tokens only: an exact prompt count and the declared output caps are exact upper bounds, and
  over-reserving them would waste budget (a request with ``max_completion_tokens: 10000`` holds
  exactly 10000 output tokens).
- A malformed or inconsistent body is a :class:`CostError` with reason ``bad_request`` naming the
  field (``param``), and so is a body that would crash llama.cpp (:func:`_check_grammar_triggers`)
  or pin one of its slots (:func:`_check_id_slot`); a prompt that cannot fit the context window is ``request_too_large``. Both
  are final (no retry helps).

Request fields that change the output length or the number of sequences. A server ignores the
fields it does not know, so each counts whichever server is behind the sidecar: the reservation
takes the largest cap and the most sequences any of them could honour.

- ``max_tokens`` (OpenAI; vLLM ``vllm/entrypoints/openai/protocol.py``; llama.cpp, an alias of
  ``n_predict``; TGI ``ChatRequest`` / ``CompletionRequest``): output cap per sequence, >= 1;
- ``max_completion_tokens`` (OpenAI; vLLM chat, where it wins over ``max_tokens``; llama.cpp, an
  alias of ``n_predict`` that wins over ``max_tokens``): output cap per sequence, >= 1;
- ``n_predict`` (llama.cpp ``tools/server/server-schema.cpp``: wins over both aliases, hard limits
  -1..INT32_MAX): output cap per sequence; -1 (its default) generates until the slot's context is
  full, so it reserves the context left;
- ``max_new_tokens`` (TGI ``GenerateParameters``, ``router/src/lib.rs``): output cap per sequence, >= 1;
- ``min_tokens`` (vLLM ``SamplingParams``): output floor per sequence, >= 0; above the cap vLLM
  applies (``max_completion_tokens``, else ``max_tokens``) it is a 400;
- ``ignore_eos`` (vLLM; llama.cpp): a boolean; with no cap the reservation is the context left, not
  ``defaultMaxTokens`` (which assumes the model stops by itself);
- ``n`` (OpenAI; vLLM; llama.cpp, an alias of ``n_cmpl``): sequences per prompt, >= 1;
- ``n_cmpl`` (llama.cpp, wins over ``n``; at most its ``--parallel``): sequences per prompt, >= 1;
  given with a different ``n`` it is a 400;
- ``best_of`` (vLLM completions; TGI ``GenerateParameters``): sequences are ``max(n, best_of)``;
  below ``n`` it is a 400 (vLLM's rule);
- ``use_beam_search`` (vLLM, beam width ``n``): a boolean; the beams are the ``n`` sequences.

Versions read: llama.cpp commit 0c1e570 (vendored by ``llama-cpp-python==0.3.36``), vLLM's
OpenAI server and ``vllm/sampling_params.py`` (``SamplingParams._verify_args``: "min_tokens must be
less than or equal to max_tokens", "best_of must be greater than or equal to n"), TGI 3.x. Every
count field is an integer (JSON ``true`` is not); ``null`` is absent, as in all three servers.
Measured on that llama-server (SmolLM2-135M, ``--parallel 2``): ``{"max_tokens": 4, "n_predict": 300,
"ignore_eos": true}`` generated 300 tokens; ``n_cmpl: 2`` returned two choices; ``n_predict: -2`` and
``n_cmpl: 3`` were refused with 400.

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
    (prompt over-reserved by the safety factor when estimated, plus output), at most
    ``maxContextTokens`` per sequence. ``sequences``: per prompt; ``prompts``: prompts sent (a
    completion's prompt array). :attr:`slots` is what the request occupies of the server's
    concurrent sequences (vLLM ``--max-num-seqs``, llama.cpp slots: each prompt and each of its
    completions is a task of its own in llama-server).
    """

    prompt_tokens: int
    output_tokens: int
    reserved_tokens: int
    prompt_exact: bool = False
    sequences: int = 1
    stream: bool = False
    include_usage: bool = False
    prompts: int = 1

    @property
    def slots(self) -> int:
        """Sequences the server runs at once for this request: ``sequences x prompts``."""
        return self.sequences * self.prompts

    @classmethod
    def fixed(cls, prompt_tokens: int, output_tokens: int, stream: bool = False) -> "RequestCost":
        """A cost given directly (tests, the simulator): exact prompt, no safety factor; ``stream``:
        the client reads a streamed answer (so a first token is seen)."""
        return cls(
            prompt_tokens, output_tokens, max(1, prompt_tokens + output_tokens), prompt_exact=True, stream=stream
        )


def _int_field(body: Mapping[str, Any], key: str, minimum: int) -> int | None:
    """``body[key]`` as an integer >= ``minimum``; None when absent or null; else a 400 naming ``key``."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CostError(Reason.BAD_REQUEST, f"'{key}' must be an integer >= {minimum}, got {value!r}", param=key)
    return value


def _bool_field(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise CostError(Reason.BAD_REQUEST, f"'{key}' must be a boolean, got {value!r}", param=key)
    return value is True


@dataclass(frozen=True, slots=True)
class _Output:
    """What a body asks for per prompt (module table): ``cap`` output tokens per sequence (None: no
    cap, ``until_full``: until the context is full), at least ``floor``, over ``sequences``."""

    cap: int | None
    until_full: bool
    floor: int
    sequences: int


def _output(body: Mapping[str, Any]) -> _Output:
    """Read and cross-check every field of the module table (raises :class:`CostError`)."""
    max_tokens = _int_field(body, "max_tokens", 1)
    max_completion = _int_field(body, "max_completion_tokens", 1)
    max_new = _int_field(body, "max_new_tokens", 1)
    n_predict = _int_field(body, "n_predict", -1)
    min_tokens = _int_field(body, "min_tokens", 0)
    ignore_eos = _bool_field(body, "ignore_eos")
    _bool_field(body, "use_beam_search")
    n = _int_field(body, "n", 1)
    n_cmpl = _int_field(body, "n_cmpl", 1)
    best_of = _int_field(body, "best_of", 1)
    if n is not None and n_cmpl is not None and n != n_cmpl:
        raise CostError(
            Reason.BAD_REQUEST, f"'n_cmpl' ({n_cmpl}) and 'n' ({n}) disagree: llama.cpp reads 'n_cmpl', "
            "other servers 'n'; send one", param="n_cmpl",
        )  # fmt: skip
    vllm_cap = max_completion if max_completion is not None else max_tokens  # vLLM's own precedence
    if min_tokens is not None and vllm_cap is not None and min_tokens > vllm_cap:
        cap_name = "max_completion_tokens" if max_completion is not None else "max_tokens"
        raise CostError(
            Reason.BAD_REQUEST, f"'min_tokens' ({min_tokens}) must be <= '{cap_name}' ({vllm_cap})", param="min_tokens"
        )
    per_prompt = n_cmpl or n or 1
    if best_of is not None and best_of < per_prompt:
        raise CostError(
            Reason.BAD_REQUEST, f"'best_of' ({best_of}) must be >= the completions asked for ({per_prompt})",
            param="best_of",
        )  # fmt: skip
    caps = [c for c in (max_tokens, max_completion, max_new, n_predict) if c is not None and c >= 0]
    until_full = n_predict == -1 or (not caps and ignore_eos)
    return _Output(
        cap=max(caps) if caps else None,
        until_full=until_full,
        floor=min_tokens or 0,
        sequences=max(per_prompt, best_of or 1),
    )


GRAMMAR_TRIGGER_TYPES = range(4)
"""llama.cpp's ``common_grammar_trigger_type`` values (``common/common.h``, commit 0c1e570): token,
word, pattern, pattern-full."""


def _check_grammar_triggers(body: Mapping[str, Any]) -> None:
    """Refuse a ``grammar_triggers`` entry whose ``type`` llama.cpp does not know: its
    ``common_sampler_init`` (``common/sampling.cpp``, commit 0c1e570) reaches
    ``GGML_ASSERT(false && "unknown trigger type")`` and the whole server aborts, ending every
    tenant's requests (measured: ``{"prompt": "hi", "grammar_triggers": [{"type": 99, "value": "x"}]}``
    on ``/v1/completions``). ``server_grammar_trigger`` reads the type with nlohmann's ``get<int>()``,
    which truncates floats and takes booleans: only an integer in range passes here."""
    triggers = body.get("grammar_triggers")
    if not isinstance(triggers, list):
        return
    for i, trigger in enumerate(triggers):
        if not isinstance(trigger, Mapping) or "type" not in trigger:
            continue  # the server refuses these itself (a JSON exception, answered as an error)
        kind = trigger["type"]
        if isinstance(kind, bool) or not isinstance(kind, int) or kind not in GRAMMAR_TRIGGER_TYPES:
            raise CostError(
                Reason.BAD_REQUEST,
                f"grammar_triggers[{i}].type must be an integer 0..3, got {kind!r}",
                param="grammar_triggers",
            )


def _check_id_slot(body: Mapping[str, Any]) -> None:
    """Refuse ``id_slot`` (anything but absent, null or -1): it pins a llama.cpp slot, and a request
    for a busy slot is deferred in the server while another slot is free
    (``get_available_slot`` and ``queue_tasks.defer`` in ``tools/server/server-context.cpp``, commit
    0c1e570; the server reads it with ``json_value(data, "id_slot", -1)``, wrapping any integer
    onto a slot). Measured: with slot 0 busy, ``{"prompt": "hi", "id_slot": 0}`` waited there,
    ``llamacpp:requests_deferred`` went to 1 and the sidecar, seeing the server queue, refused every
    other tenant. Which slot serves a request is the server's choice, not a client's."""
    slot = body.get("id_slot")
    if slot is not None and not (isinstance(slot, int) and not isinstance(slot, bool) and slot == -1):
        raise CostError(
            Reason.BAD_REQUEST,
            f"'id_slot' ({slot!r}) pins a model-server slot; the sidecar does not admit pinned requests: omit it",
            param="id_slot",
        )


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
    _check_grammar_triggers(body)
    _check_id_slot(body)
    if path == CHAT_PATH:
        chars, overhead, images = _chat_prompt_chars(body)
        prompts = [(chars, None)]
        fixed_tokens = overhead + images * IMAGE_TOKENS
    elif path == COMPLETIONS_PATH:
        prompts = _completion_prompts(body)
        fixed_tokens = 0
    else:
        raise ValueError(f"not an admitted path: {path}")
    asked = _output(body)
    sequences = asked.sequences

    exact = prompt_tokens is not None or all(tokens is not None for _, tokens in prompts)
    if prompt_tokens is not None:  # one exact count for all prompts together, shared out to the token
        share, extra = divmod(prompt_tokens, len(prompts))
        per_prompt = [(share + (i < extra), share + (i < extra)) for i in range(len(prompts))]
    else:
        per_prompt = [
            (t, t)
            if t is not None
            else (math.ceil(c / chars_per_token) + fixed_tokens, math.ceil(c / MAX_CHARS_PER_TOKEN) + fixed_tokens)
            for c, t in prompts
        ]
    total_prompt = 0
    output = 0
    reserved = 0
    for estimate, lower in per_prompt:
        context_left = max_context_tokens - lower
        if context_left < 1:
            raise CostError(
                Reason.REQUEST_TOO_LARGE,
                f"the prompt ({lower} tokens) leaves no room for output in the {max_context_tokens}-token context",
                param="messages" if path == CHAT_PATH else "prompt",
                code="context_length_exceeded",
            )
        if asked.until_full:
            per_sequence = context_left
        elif asked.cap is not None:
            per_sequence = asked.cap
        else:
            per_sequence = default_max_tokens or context_left
        prompt_output = min(max(per_sequence, asked.floor), context_left) * sequences
        prompt_reserved = estimate if exact else math.ceil(estimate * safety_factor)
        # no sequence holds more than the context window, whatever the estimate's safety margin says
        reserved += min(prompt_reserved + prompt_output, max_context_tokens * sequences)
        output += prompt_output
        total_prompt += estimate
    stream_options = body.get("stream_options")
    include_usage = isinstance(stream_options, Mapping) and stream_options.get("include_usage") is True
    return RequestCost(
        prompt_tokens=total_prompt,
        output_tokens=output,
        reserved_tokens=max(1, reserved),
        prompt_exact=exact,
        sequences=sequences,
        stream=body.get("stream") is True,
        include_usage=include_usage,
        prompts=len(per_prompt),
    )
