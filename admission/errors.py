"""The one place where admission reasons become HTTP: status, OpenAI error body, retry headers.

===============================  ======  ==========================================
reason                           status  meaning for the client
===============================  ======  ==========================================
``bad_request``                  400     fix the request (not JSON, wrong types, ...)
``request_too_large``            400     prompt over the model's context
                                         (code ``context_length_exceeded``)
``request_too_large``            413     body over ``maxRequestBytes``, or the cost
                                         can never fit the replica or the tenant
``bad_request``                  408     the body did not arrive within
                                         ``bodyReadTimeoutSeconds`` (code
                                         ``body_read_timeout``; the connection closes)
``unauthorized``                 401     unknown API key
``bad_request``                  403     a generation route the sidecar does not
                                         admit (code ``path_not_admitted``; use
                                         ``/v1/chat/completions``, ``/v1/completions``)
``tenant_concurrency``,          429     this tenant is over its quota: back off
``tenant_rate``
capacity reasons (budget,        503     this replica is full or degraded: retry
queue, KV, GPU, circuit, SLO)            (another replica, or after Retry-After)
``not_active``                   503     warm or draining replica: retry elsewhere
===============================  ======  ==========================================

Every 429 and 503 carries ``Retry-After`` (whole seconds, at least 1, rounded up) and
``retry-after-ms`` (the engine's drain/refill/cooldown estimate in milliseconds, at least
:data:`MIN_RETRY_MS`), which the official OpenAI SDKs honour. 400/401/403/408/413 carry none: retrying
the same request cannot help (or, for 408, only a faster client can).

Body shape (OpenAI)::

    {"error": {"message": "...", "type": "rate_limit_error", "param": null, "code": "tenant_rate"}}
"""

import json
import math

from tidegate.admission.reasons import CAPACITY_REASONS, Reason

MIN_RETRY_MS = 100
BODY_READ_TIMEOUT = "body_read_timeout"
"""The ``code`` of a ``bad_request`` whose body was too slow to arrive (HTTP 408)."""
PATH_NOT_ADMITTED = "path_not_admitted"
"""The ``code`` of a ``bad_request`` for a model server's own generation route (HTTP 403,
:mod:`tidegate.admission.paths`)."""
_POLICY_429 = frozenset({Reason.TENANT_CONCURRENCY, Reason.TENANT_RATE})


def status_of(reason: Reason, code: str | None = None) -> int:
    """HTTP status for a rejection (module table)."""
    if reason is Reason.REQUEST_TOO_LARGE:
        return 400 if code == "context_length_exceeded" else 413
    if reason is Reason.BAD_REQUEST:
        return {BODY_READ_TIMEOUT: 408, PATH_NOT_ADMITTED: 403}.get(code or "", 400)
    if reason is Reason.UNAUTHORIZED:
        return 401
    if reason in _POLICY_429:
        return 429
    if reason in CAPACITY_REASONS or reason is Reason.NOT_ACTIVE:
        return 503
    raise ValueError(f"no HTTP status for reason {reason!r}")


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "invalid_request_error",
          404: "invalid_request_error", 405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
          429: "rate_limit_error", 503: "service_unavailable_error"}  # fmt: skip


_BODIES: dict[tuple[int, str, str, str | None], bytes] = {}
_MAX_CACHED_BODIES = 1024


def error_body(status: int, message: str, code: str, param: str | None = None) -> bytes:
    """An OpenAI-style error document (JSON bytes).

    Built once per distinct refusal and then reused: a tenant flooding the sidecar meets the same
    message again and again, and serialising it was a tenth of the cost of a fast refusal."""
    key = (status, message, code, param)
    body = _BODIES.get(key)
    if body is None:
        if len(_BODIES) >= _MAX_CACHED_BODIES:  # messages carry tenant names: bounded
            _BODIES.clear()
        doc = {"error": {"message": message, "type": _TYPES.get(status, "api_error"), "param": param, "code": code}}
        body = _BODIES[key] = json.dumps(doc).encode()
    return body


def retry_headers(retry_after_s: float | None) -> dict[str, str]:
    """``Retry-After`` (whole seconds >= 1) and ``retry-after-ms`` for a retry estimate."""
    seconds = max(0.0, retry_after_s or 0.0)
    return {
        "Retry-After": str(max(1, math.ceil(seconds))),
        "retry-after-ms": str(max(MIN_RETRY_MS, math.ceil(seconds * 1000))),
    }


def rejection(
    reason: Reason, message: str, retry_after_s: float | None, code: str | None = None, param: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) for a rejection; retry headers on every 429 and 503."""
    status = status_of(reason, code)
    headers = {"Content-Type": "application/json"}
    if status in (429, 503):
        headers.update(retry_headers(retry_after_s))
    return status, headers, error_body(status, message, code or reason.value, param)
