"""OpenAI-compatible request parsing and response shapes, as vLLM's OpenAI server produces them.

Requests (``/v1/chat/completions``, ``/v1/completions``), fields read:

- ``model`` (optional; another name than the served one is a 404, as in vLLM);
- ``messages`` (chat) or ``prompt`` (completions: a string, a list of one string, or token ids);
- ``max_completion_tokens`` / ``max_tokens`` (chat: the first given wins, as in vLLM);
  completions default ``max_tokens`` to 16 like vLLM's ``CompletionRequest``; ``null`` or absent on
  chat means "until end of sequence", which the sim models as ``default_max_tokens`` tokens;
- ``n`` (>= 1), ``stream``, ``stream_options.include_usage`` (``stream_options`` without
  ``stream`` is a 400, as in vLLM);
- ``sim_output_tokens`` (an extension real servers ignore): stop with ``finish_reason: "stop"``
  after that many tokens when it is below the cap, to model an early end of sequence.

Streams: one ``data: {chunk}\\n\\n`` event per token; chat streams open with a role chunk
(``delta: {"role": "assistant", "content": ""}``) sent with the first token; the chunk of a
choice's last token carries its ``finish_reason``; with ``include_usage`` a final chunk with
``choices: []`` and ``usage`` follows; then ``data: [DONE]``. Without ``include_usage`` no
chunk carries a ``usage`` key.

Errors: :class:`BadRequest` (400) and :class:`ModelNotFound` (404), both :class:`ApiError`,
whose ``body()`` is the OpenAI error object.
"""

import dataclasses
from typing import Literal

from tidegate.sim import tokenizer

Kind = Literal["chat", "completion"]
MAX_N = 128
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class ApiError(Exception):
    status = 500
    error_type = "InternalServerError"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> dict[str, object]:
        return error_body(self.message, self.error_type, self.status, self.param)


class BadRequest(ApiError):
    status = 400
    error_type = "BadRequestError"


class ModelNotFound(ApiError):
    status = 404
    error_type = "NotFoundError"


def error_body(message: str, error_type: str, code: int, param: str | None = None) -> dict[str, object]:
    """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """A parsed completion request. ``max_tokens`` is the client's cap (``None``: none given)."""

    kind: Kind
    model: str
    prompt_tokens: int
    n: int
    stream: bool
    include_usage: bool
    max_tokens: int | None
    sim_output_tokens: int | None

    def plan(self, max_model_len: int, default_max_tokens: int) -> tuple[int, str]:
        """Tokens each choice will emit and the ``finish_reason`` it ends with.

        Over-long requests are left to the replica model, which raises ``PromptTooLong``.
        """
        if self.max_tokens is not None:
            cap, reason = self.max_tokens, "length"
        else:
            cap, reason = max(1, min(default_max_tokens, max_model_len - self.prompt_tokens)), "stop"
        if self.sim_output_tokens is not None and self.sim_output_tokens < cap:
            return self.sim_output_tokens, "stop"
        return cap, reason


def _opt_int(body: dict, key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"{key} must be an integer >= {minimum}, got {value!r}", key)
    return value


def parse(kind: Kind, body: object, served_model: str) -> GenerationRequest:
    """Validate a request body; raises :class:`BadRequest` or :class:`ModelNotFound`."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model", served_model)
    if model is None:
        model = served_model
    if not isinstance(model, str):
        raise BadRequest("model must be a string", "model")
    if model != served_model:
        raise ModelNotFound(f"The model `{model}` does not exist.", "model")
    try:
        if kind == "chat":
            if "messages" not in body:
                raise BadRequest("messages is required", "messages")
            prompt_tokens = tokenizer.count(tokenizer.render_chat(body["messages"]))
        else:
            if "prompt" not in body:
                raise BadRequest("prompt is required", "prompt")
            prompt_tokens = tokenizer.prompt_tokens(body["prompt"])
    except tokenizer.PromptError as exc:
        raise BadRequest(str(exc), "messages" if kind == "chat" else "prompt") from None
    if kind == "chat":
        cap = _opt_int(body, "max_completion_tokens", 1)
        if cap is None:
            cap = _opt_int(body, "max_tokens", 1)
    else:
        cap = _opt_int(body, "max_tokens", 1) if "max_tokens" in body else COMPLETIONS_DEFAULT_MAX_TOKENS
    n = _opt_int(body, "n", 1) or 1
    if n > MAX_N:
        raise BadRequest(f"n must be <= {MAX_N}", "n")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise BadRequest("Stream options can only be defined when `stream=True`.", "stream_options")
        if not isinstance(options, dict):
            raise BadRequest("stream_options must be an object", "stream_options")
        include_usage = options.get("include_usage", False) is True
    return GenerationRequest(
        kind=kind,
        model=model,
        prompt_tokens=max(1, prompt_tokens),
        n=n,
        stream=stream,
        include_usage=include_usage,
        max_tokens=cap,
        sim_output_tokens=_opt_int(body, "sim_output_tokens", 1),
    )


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chunk(req: GenerationRequest, rid: str, created: int, index: int, text: str | None, finish: str | None) -> dict:
    """One stream chunk for choice ``index``; ``text=None`` on chat means the opening role chunk."""
    if req.kind == "chat":
        delta = {"role": "assistant", "content": ""} if text is None else {"content": text}
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish, "stop_reason": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": req.model, "choices": [choice]}


def usage_chunk(req: GenerationRequest, rid: str, created: int, completion_tokens: int) -> dict:
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": req.model,
        "choices": [],
        "usage": usage(req.prompt_tokens, completion_tokens),
    }


def response(req: GenerationRequest, rid: str, created: int, choices: list[tuple[int, str]]) -> dict:
    """The non-streamed response; ``choices`` = (tokens emitted, finish_reason) per choice."""
    out = []
    for index, (tokens, finish) in enumerate(choices):
        text = "".join(tokenizer.output_texts(0, tokens))
        if req.kind == "chat":
            message = {"role": "assistant", "content": text, "tool_calls": []}
            out.append({"index": index, "message": message, "logprobs": None, "finish_reason": finish})
        else:
            out.append({"index": index, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None})
    return {
        "id": rid,
        "object": "chat.completion" if req.kind == "chat" else "text_completion",
        "created": created,
        "model": req.model,
        "choices": out,
        "usage": usage(req.prompt_tokens, sum(t for t, _ in choices)),
    }
