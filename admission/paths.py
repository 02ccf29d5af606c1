"""Which request paths go through admission, which are refused, and which pass through.

The sidecar admits the two OpenAI generation routes and passes every other path to the model
server untouched (``/v1/models``, ``/tokenize``, ``/health``, ...). Model servers also generate on
routes of their own; passed through, those would spend the GPU outside the token budget. So:

- **admitted aliases** (:data:`ADMITTED`): routes that take the same OpenAI body as an admitted
  path are admitted as that path and forwarded to it. Only llama.cpp's ``/chat/completions``
  is such an alias (the same handler as its ``/v1/chat/completions``).
- **refused** (:data:`GENERATION_PATHS`): every other generation route of vLLM, llama.cpp and TGI
  is refused (403, reason ``bad_request``, code ``path_not_admitted``: :data:`tidegate.admission.errors.PATH_NOT_ADMITTED`), whatever the pool's
  engine: one union set, because an ``openai`` engine may be any of the three and a route one
  engine lacks costs nothing to refuse. llama.cpp's ``/completions`` is refused, not admitted:
  it is llama.cpp's native ``/completion`` (``n_predict``, a stream without ``[DONE]``), not
  the OpenAI one.

Matching is on the path as the model server will route it: percent-decoded once (a backend
decodes once, so ``%2F`` is a slash to it), case-folded and without a trailing slash (neither
changes routing on the three engines, but costs nothing to cover). Dot and empty segments are
refused before this (``sidecar``). Only the methods a route can generate on are concerned:
``GET``, ``HEAD`` and ``OPTIONS`` pass through (``GET /`` is TGI's health and llama.cpp's web UI).

Sources (routes registered by each server):

- vLLM: ``docs/usage/security.md`` ("API Key Authentication Limitations": ``/v1/responses``,
  ``/v1/messages``, ``/v1/chat/completions/batch``, ``/v1/audio/transcriptions``,
  ``/v1/audio/translations``, ``/inference/v1/generate``, ``/invocations``, ``/generative_scoring``).
  Pooling routes (``/pooling``, ``/classify``, ``/score``, ``/rerank``, ``/v1/embeddings``) are
  served only by pooling models, never by a generating one, and pass through.
- llama.cpp: ``tools/server/server.cpp`` (``/completion``, ``/completions``, ``/infill``,
  ``/chat/completions``, ``/v1/responses``, ``/responses``, ``/v1/audio/transcriptions``,
  ``/audio/transcriptions``, ``/v1/messages``; ``/api/chat`` in some releases).
- TGI: ``router/src/server.rs`` (``POST /`` is ``compat_generate``, ``/generate``,
  ``/generate_stream``, ``/invocations``, ``/vertex``; with the ``kserve`` feature
  ``/v2/models/{name}/versions/{version}/infer``).

Not covered: a predict route set through ``AIP_PREDICT_ROUTE`` (Vertex AI) is whatever the
environment says; the sidecar does not relay WebSocket upgrades (vLLM's ``/v1/realtime``).

Pure: no I/O.
"""

import urllib.parse

from tidegate.admission.cost import CHAT_PATH, COMPLETIONS_PATH

ADMITTED = {
    CHAT_PATH: CHAT_PATH,
    COMPLETIONS_PATH: COMPLETIONS_PATH,
    "/chat/completions": CHAT_PATH,  # llama.cpp: the same handler as /v1/chat/completions
}
"""Route key -> the admitted path it is admitted (and forwarded) as."""

GENERATION_PATHS = frozenset(
    {
        # vLLM
        "/v1/responses",
        "/v1/messages",
        "/v1/chat/completions/batch",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/inference/v1/generate",
        "/invocations",
        "/generative_scoring",
        # llama.cpp
        "/completion",
        "/completions",
        "/infill",
        "/responses",
        "/audio/transcriptions",
        "/api/chat",
        # TGI
        "/",
        "/generate",
        "/generate_stream",
        "/vertex",
    }
)
"""Route keys of generation routes the sidecar refuses (module docstring: sources)."""

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def route_key(raw_path: str) -> str:
    """The path as a model server routes it: percent-decoded once, case-folded, no trailing slash."""
    path = urllib.parse.unquote(raw_path).casefold()
    return path.rstrip("/") or "/"


def admitted_as(method: str, raw_path: str) -> str | None:
    """The admitted path (:data:`CHAT_PATH` or :data:`COMPLETIONS_PATH`) a ``POST`` to ``raw_path``
    is admitted as, or None."""
    return ADMITTED.get(route_key(raw_path)) if method == "POST" else None


def refused(method: str, raw_path: str) -> bool:
    """Whether a request is for a generation route the sidecar refuses (:data:`GENERATION_PATHS`)."""
    if method.upper() in SAFE_METHODS:
        return False
    key = route_key(raw_path)
    if key in GENERATION_PATHS:
        return True
    parts = key.split("/")  # TGI's KServe route: /v2/models/{name}/versions/{version}/infer
    return len(parts) >= 5 and parts[1:3] == ["v2", "models"] and parts[-1] == "infer"


def refusal_message(method: str, raw_path: str) -> str:
    """The error message of a refused route: what it is and the paths to use instead."""
    shown = urllib.parse.unquote(raw_path)[:200]
    return (
        f"{method} {shown} is a generation route this sidecar does not admit; "
        f"send OpenAI requests to POST {CHAT_PATH} or POST {COMPLETIONS_PATH}"
    )
