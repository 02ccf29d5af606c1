"""Whose doing is an upstream error answer: the client's (a request the server refused) or the replica's?

Only the replica's errors may count against it in the circuit breaker
(:mod:`tidegate.admission.breaker`); the client's are *neutral*. By status first, then by the error
body where the status lies:

- 4xx: the client's (429 included: the server protecting itself is not degradation);
- 501 Not Implemented: the request asked for something this server does not do (llama.cpp's
  ``not_supported_error``, e.g. embeddings on a server started without them): the client's;
- any other 5xx whose OpenAI-style error body says the request was at fault: an error ``type`` of
  :data:`CLIENT_ERROR_TYPES` (OpenAI and llama.cpp ``invalid_request_error``, vLLM
  ``BadRequestError``, TGI's ``error_type: validation``, ...) or an integer ``code`` in 400..499
  (vLLM's flat ``{"object": "error", "code": 400}``);
- llama.cpp (commit 0c1e570, the one ``llama-cpp-python==0.3.36`` vendors) answers **500
  ``server_error``** for every exception its request parsing throws that is not a
  ``std::invalid_argument`` (``ex_wrapper`` in ``tools/server/server.cpp``): a malformed ``tools``
  array (``common_chat_tools_parse_oaicompat`` in ``common/chat.cpp``: "Failed to parse tools: ..."),
  malformed ``messages``, an unknown ``reasoning_format`` on a chat request ("Unknown reasoning
  format: ...", measured with ``"reasoning_format": "bogus"``), a grammar of the request that
  rejects the text being generated (measured: ``"grammar_lazy": true`` with a ``grammar`` and an
  empty trigger pattern, answered "got exception: Unexpected empty grammar stack ..."), a JSON
  value of the wrong type (nlohmann's ``[json.exception.type_error.302] ...``), a tool call
  without ``--jinja``, an empty prompt, ... Those messages
  (:data:`LLAMACPP_REQUEST_ERRORS`, taken from ``tools/server/server-common.cpp``,
  ``tools/server/server-chat.cpp`` and ``common/chat.cpp`` at that commit) are the client's; every
  other ``server_error`` (a failed decode, "context shift is disabled", a slot that could not be
  restored, ...) stays the replica's. Measured on that llama-server: ``"tools": [{}]`` was answered
  500 ``{"error": {"code": 500, "message": "Failed to parse tools: Missing tool type: {}; tools = ...",
  "type": "server_error"}}``, a message with a numeric ``role`` 500 "Failed to parse messages:
  [json.exception.type_error.302] ...", while wrong-typed ``max_tokens`` or ``content`` got 400.

Everything else (5xx without a recognisable body, connection errors, timeouts) is the replica's.

Pure: no I/O.
"""

import json
from typing import Any

CLIENT_ERROR_TYPES = frozenset(
    {
        "invalid_request_error",  # OpenAI; llama.cpp ERROR_TYPE_INVALID_REQUEST
        "not_supported_error",  # llama.cpp ERROR_TYPE_NOT_SUPPORTED
        "exceed_context_size_error",  # llama.cpp ERROR_TYPE_EXCEED_CONTEXT_SIZE
        "not_found_error",  # llama.cpp ERROR_TYPE_NOT_FOUND
        "authentication_error",
        "permission_error",
        "BadRequestError",  # vLLM ErrorResponse.type for HTTP 400
        "NotFoundError",  # vLLM, unknown model or LoRA
        "validation",  # TGI ErrorResponse.error_type (input validation)
        "template_error",  # TGI chat template rendering of the client's messages
    }
)
"""Error types that name a fault of the request, whatever status came with them."""

LLAMACPP_REQUEST_ERRORS = (
    "[json.exception.",  # nlohmann::json: a body field of the wrong type or shape
    "Failed to parse ",  # common/chat.cpp: messages, tools, tool call arguments
    "Failed to load image or audio file",  # server-common.cpp: the request's media
    "Failed to download image",
    "Failed to tokenize prompt",
    "Invalid base64 value",
    "image input is not supported",
    "audio input is not supported",
    "video input is not supported",
    "Multimodal data provided, but model does not support",
    "for mtmd, input prompt must be a string",
    "tools param requires --jinja flag",  # a feature this server was not started with
    "tool_choice param requires --jinja flag",
    '"prompt" ',  # "prompt" is required / must not be empty / elements must be ...
    "'messages' is required",
    "Unsupported param: ",
    "Unknown reasoning format",  # common/chat.cpp common_reasoning_format_from_name: the body's reasoning_format
    # src/llama-grammar.cpp llama_grammar_accept_*, re-thrown by the slot loop (server-context.cpp
    # ``iterate``: "got exception: ..."): the request's own grammar rejected the text (a lazy grammar
    # whose trigger matches what it cannot parse); other "got exception: " messages stay the replica's
    "got exception: Unexpected empty grammar stack",
    "Only no echo is supported",
    "Cannot use both json_schema and grammar",
    "Cannot specify both content and content_parts",
    "Cannot specify grammar with tools",
)
"""Starts of llama.cpp's HTTP 500 ``server_error`` messages that are request parsing failures."""

MAX_JUDGED_BODY_BYTES = 1 << 20
"""A longer error body is not parsed (judged the replica's): no JSON parse of a huge answer."""


def client_caused(status: int, body: bytes) -> bool:
    """True when an upstream error answer (``status`` >= 400, its ``body``) is the client's doing,
    so it must not count against the replica (module docstring for the rules and their sources)."""
    if 400 <= status < 500 or status == 501:
        return True
    if status < 500 or not body or len(body) > MAX_JUDGED_BODY_BYTES:
        return False
    try:
        doc: Any = json.loads(body)
    except (ValueError, RecursionError):
        return False
    if not isinstance(doc, dict):
        return False
    error = doc.get("error")
    if isinstance(error, dict):  # OpenAI, llama.cpp, current vLLM
        kind, message, code = error.get("type"), error.get("message"), error.get("code")
    elif isinstance(error, str):  # TGI: {"error": "...", "error_type": "..."}
        kind, message, code = doc.get("error_type"), error, None
    else:  # older vLLM: {"object": "error", "message", "type", "code"}
        kind, message, code = doc.get("type"), doc.get("message"), doc.get("code")
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 500:
        return True
    if isinstance(kind, str) and kind in CLIENT_ERROR_TYPES:
        return True
    return kind == "server_error" and isinstance(message, str) and message.startswith(LLAMACPP_REQUEST_ERRORS)
