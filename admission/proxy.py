"""Relaying to the model server: admitted completions (with SSE) and plain pass-through.

One keep-alive connection pool (``aiohttp.ClientSession``) to the upstream on localhost. (A
home-made HTTP/1.1 client on ``httptools`` cost ~100 µs less CPU per request and was measured, then
not kept: the project uses a well-kept library over its own code outside admission itself; the
figures are in ``bench/admission_proxy.py``'s notes.)
Guarantees of :meth:`Forwarder.forward` (the admitted path):

- server-sent events are relayed event by event as they arrive: each upstream event (up to its
  blank line) is one write to the client, never held back for the next one; the response says
  ``Cache-Control: no-cache`` and ``X-Accel-Buffering: no`` so nginx-style intermediaries do not
  buffer either;
- a streamed request always asks the upstream for the usage chunk
  (``stream_options.include_usage``); a client that did not ask never sees it. Usage that comes
  on a chunk with choices (llama.cpp's streamed ``/v1/completions`` sends it on each completion's
  last chunk) is read too, and the chunk is relayed unchanged;
- the outcome is reported exactly once through the returned :class:`Relay` record, on every path:
  completion (``success``), upstream 5xx / connection error / timeout / broken stream
  (``failure``), upstream 4xx incl. 429 and a 5xx the client caused, by its error body
  (:mod:`tidegate.admission.blame`: llama.cpp's 500 for a malformed ``tools`` array) (``neutral``),
  client gone (``cancelled``);
- a stream the upstream ends (even cleanly) without saying it is over, i.e. neither
  ``data: [DONE]`` nor a chunk with a ``finish_reason``, is truncated: the client gets an SSE
  error event (``upstream_error``) and the outcome is ``failure``, or ``neutral`` when the stream
  carried an error event the request caused (:func:`_note_error_event`). A ``finish_reason`` without
  ``[DONE]`` counts as over (TGI before 2.2 sent no ``[DONE]``); nothing is added for the client;
- when the client goes away mid-stream the upstream connection is closed at once (not returned
  to the pool), which is how vLLM, llama.cpp and TGI learn to abort the generation (so the
  header that makes llama.cpp keep a stream going without its client, ``X-Conversation-Id``, is
  not forwarded: :data:`_DROP_ADMITTED`).

Upstream errors before any byte reached the client become OpenAI-style 502 / 504 answers. An
upstream 5xx keeps its status, but its body is always an OpenAI error: one already in that shape
is relayed as is; anything else (an HTML page from a proxy, a plain-text crash, vLLM's older flat
``{"object": "error", "message"}``, TGI's ``{"error": "..."}``, FastAPI's ``{"detail": "..."}``) becomes
``{"error": {"message", "type": "api_error", "param": null, "code": "upstream_error"}}`` with the
upstream's message when it has one of at most :data:`MAX_RELAYED_MESSAGE_CHARS` characters.
"""

import asyncio
import contextlib
import email.utils
import json
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tidegate.admission import blame, errors
from tidegate.admission.breaker import Completion
from tidegate.admission.reasons import Reason

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "host", "content-length"}
)  # fmt: skip
_DROP_ADMITTED = frozenset({"accept-encoding", "content-type", "x-conversation-id"})
"""Request headers an admitted request is sent upstream without: answers are relayed uncompressed,
the JSON content type is set here, and ``X-Conversation-Id`` turns a llama.cpp stream into a
resumable one that keeps generating after its client (the sidecar) closes the connection
(``server_res_spipe::should_stop`` in ``tools/server/server-stream.cpp``, llama.cpp 0c1e570): the
slot would stay busy after the sidecar released its reservation."""
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
UPSTREAM_IDLE_S = 4.0
"""Seconds an idle upstream connection is kept for reuse: below the 5 s idle timeout of uvicorn
(``timeout_keep_alive``, which serves vLLM) and of cpp-httplib (``CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND``,
which serves llama.cpp). A streamed request is sent with ``Connection: close``, so its connection
is never reused: llama-server (llama.cpp 0c1e570) closes it shortly after the stream without saying
so, and the next request on it failed with ``ServerDisconnectedError`` (measured). The price is a
loopback connect per streamed request."""
MAX_RELAYED_MESSAGE_CHARS = 512
"""An upstream error text longer than this is summarised, not relayed (it is usually an HTML page)."""
MAX_RELAYED_RETRY_S = 3600
"""An upstream ``Retry-After`` above this many seconds (``1e308``, ``inf``) is relayed as this."""
_REPLACED_HEADERS = frozenset({"content-type", "content-encoding", "content-length"})
_FINISH_REASON = re.compile(rb'"finish_reason":\s*"')  # a string value: that choice is over (null: not yet)


@dataclass(slots=True)
class Relay:
    """What happened to one admitted request upstream (filled in by :meth:`Forwarder.forward`)."""

    completion: Completion = Completion.FAILURE
    ttft_s: float | None = None  # from ``started`` to the first streamed event
    used_tokens: int | None = None
    usage_reported: bool = False
    chunks: int = 0
    status: int = 0
    started_s: float = 0.0  # when the request was sent upstream (clock seconds)
    shed_retry_s: float | None = None  # set (with a task cancel) when the sidecar sheds the request
    on_first_event: Callable[[float], None] | None = None  # called with the TTFT at the first streamed event
    finished: bool = False  # the stream said it was over: ``data: [DONE]`` or a ``finish_reason``
    usage_final: bool = False  # a usage chunk without choices (OpenAI, vLLM) was seen: it is the total
    usage_by_choice: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (prompt, completion)
    client_error_event: bool = False  # the stream carried an error event the request caused (blame)


class _ClientGone(Exception):
    """Writing to the client failed: it went away."""


_ANSWERED_HERE = frozenset({"expect"})
"""Request headers the sidecar has already acted on: aiohttp answers ``Expect: 100-continue``
before the handler runs; forwarded, the upstream client would hold the body back until the model
server sent a 100 of its own, and a server that ignores Expect (RFC 9110 10.1.1) would hang."""
_NOT_FORWARDED = HOP_BY_HOP | _ANSWERED_HERE


def request_headers(headers: Any, drop: frozenset[str] = frozenset()) -> dict[str, str]:
    """Headers to send upstream: hop-by-hop headers, ``Expect`` (answered here) and ``drop`` removed."""
    return {k: v for k, v in headers.items() if (low := k.lower()) not in _NOT_FORWARDED and low not in drop}


def _usage_total(doc: Any) -> int | None:
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int) and total > 0:
        return total
    parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    return sum(p for p in parts if isinstance(p, int)) or None


def _note_choice_usage(relay: Relay, doc: dict[str, Any]) -> None:
    """Usage on a chunk that also carries choices: llama.cpp's streamed ``/v1/completions`` puts each
    completion's usage on its last chunk, next to ``choices[{finish_reason}]``
    (``server_task_result_cmpl_final::to_json_oaicompat`` in ``tools/server/server-task.cpp``,
    llama.cpp 0c1e570); vLLM's ``continuous_usage_stats`` puts a running count on every chunk. The
    latest usage per choice index counts, the prompt once and the completions added up (OpenAI's
    usage for ``n > 1``), until a usage chunk without choices gives the total."""
    usage, choices = doc.get("usage"), doc.get("choices")
    if not isinstance(usage, dict) or not isinstance(choices, list) or not isinstance(choices[0], dict):
        return
    index = choices[0].get("index", 0)
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        total = _usage_total(doc)
        if total is None:
            return
        prompt, completion = 0, total
    relay.usage_by_choice[index if isinstance(index, int) else 0] = (max(0, prompt), max(0, completion))
    seen = relay.usage_by_choice.values()
    total = max(p for p, _ in seen) + sum(c for _, c in seen)
    if total > 0:
        relay.used_tokens, relay.usage_reported = total, True


def _note_error_event(relay: Relay, payload: bytes) -> None:
    """An error event inside a 200 stream: llama.cpp sends an error raised after the first result
    (``send_error`` from the slot loop, ``tools/server/server-context.cpp``, commit 0c1e570) as
    ``data: {"error": {"code", "message", "type"}}`` and ends the stream, e.g. a lazy grammar of the
    request that rejects the generated text. It is judged like an error answer with that code
    (:mod:`tidegate.admission.blame`): when the request caused it, the cut-short stream is neutral."""
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict):
        return
    code = error.get("code")
    status = code if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600 else 500
    relay.client_error_event = blame.client_caused(status, payload)


class Forwarder:
    """The upstream connection pool and the two ways of relaying."""

    def __init__(
        self, upstream: str, note_progress: Callable[[], None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self._note_progress = note_progress
        self._clock = clock
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # Idle upstream connections are dropped before the model servers drop them (uvicorn, which
        # serves vLLM, and cpp-httplib, which serves llama.cpp, both close after 5 s idle): a request
        # sent on a connection the server is closing fails before it is read, as a 502 and a
        # breaker failure.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_IDLE_S, enable_cleanup_closed=True)
        self.session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout()
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def forward(
        self,
        request: web.Request,
        path: str,
        body: dict[str, Any],
        raw: bytes,
        *,
        stream: bool,
        client_wants_usage: bool,
        prompt_tokens: int,
        timeout_s: float,
        relay: Relay,
    ) -> web.StreamResponse:
        """Send an admitted request upstream and relay the answer; ``relay`` records the outcome."""
        session = self.session
        assert session is not None, "Forwarder.start() first"
        started = relay.started_s = self._clock()
        payload = raw
        if stream and not client_wants_usage:
            options = body.get("stream_options")
            body = {**body, "stream_options": {**(options if isinstance(options, dict) else {}), "include_usage": True}}
            payload = json.dumps(body).encode()
        headers = request_headers(request.headers, _DROP_ADMITTED)
        headers["Content-Type"] = "application/json"
        if stream:  # llama.cpp closes the connection after a stream without saying so: see UPSTREAM_IDLE_S
            headers["Connection"] = "close"
        up: aiohttp.ClientResponse | None = None
        response: web.StreamResponse | None = None
        try:
            up = await session.post(
                self.upstream + path, data=payload, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            )
            relay.status = up.status
            if up.status >= 500:
                relay.completion = Completion.FAILURE
            elif up.status >= 400:
                relay.completion = Completion.NEUTRAL
            if up.status == 200 and up.content_type == "text/event-stream":
                response = web.StreamResponse(
                    status=200,
                    headers={**SSE_HEADERS, "Content-Type": up.headers.get("Content-Type", "text/event-stream")},
                )
                await response.prepare(request)
                await self._relay_events(up, response, relay, started, client_wants_usage)
                if stream and not relay.finished:  # a clean end of the response, but not of the answer
                    relay.completion = Completion.NEUTRAL if relay.client_error_event else Completion.FAILURE
                    return await _stream_error(
                        response, 502, "the model server ended the stream before it finished (no [DONE])",
                        "upstream_error",
                    )  # fmt: skip
                await response.write_eof()
            else:
                data = await up.read()
                self._note_progress()
                if up.status < 400:
                    relay.completion = Completion.SUCCESS
                    if up.content_type == "application/json":
                        try:
                            relay.used_tokens = _usage_total(json.loads(data))
                        except ValueError:
                            relay.used_tokens = None
                        relay.usage_reported = relay.used_tokens is not None
                if up.status >= 500:
                    if blame.client_caused(up.status, data):
                        relay.completion = Completion.NEUTRAL  # the request's fault, not the replica's
                    response = _upstream_error(up, data)
                else:
                    response = web.Response(status=up.status, body=data, headers=_response_headers(up.headers.items()))
                if up.status in (429, 503):
                    _honest_retry_headers(response, up.headers.get("Retry-After"))
            if relay.chunks and not relay.usage_reported:
                relay.used_tokens = prompt_tokens + relay.chunks  # counted: ~one token per event
            return response
        except asyncio.CancelledError:
            if relay.shed_retry_s is None:
                relay.completion = Completion.CANCELLED
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # shed by the sidecar, not gone: the client is told to retry
            relay.completion = Completion.NEUTRAL
            return await self._shed_answer(response, relay.shed_retry_s)
        except _ClientGone:
            relay.completion = Completion.CANCELLED
            return response or web.Response(status=499)
        except TimeoutError:
            relay.completion = Completion.FAILURE
            if response is not None:
                return await _stream_error(
                    response, 504, f"the model server did not finish within {timeout_s:g} s", "upstream_timeout"
                )
            status, hdrs, body_bytes = (
                504,
                {"Content-Type": "application/json"},
                errors.error_body(504, f"the model server did not answer within {timeout_s:g} s", "upstream_timeout"),
            )
            return web.Response(status=status, headers=hdrs, body=body_bytes)
        except aiohttp.ClientError as exc:
            relay.completion = Completion.FAILURE
            if response is not None:
                return await _stream_error(
                    response, 502, f"the model server failed mid-stream: {type(exc).__name__}", "upstream_error"
                )
            return web.Response(
                status=502, headers={"Content-Type": "application/json"},
                body=errors.error_body(502, f"model server unreachable: {type(exc).__name__}", "upstream_error"),
            )  # fmt: skip
        finally:
            if up is not None:
                if relay.completion is Completion.SUCCESS or relay.completion is Completion.NEUTRAL:
                    up.release()
                else:
                    up.close()  # drop the connection: the backend aborts the generation

    async def _shed_answer(self, response: web.StreamResponse | None, retry_s: float) -> web.StreamResponse:
        message = "request shed: running far longer than predicted; retry"
        if response is None:
            status, headers, body = errors.rejection(Reason.TOKEN_BUDGET, message, retry_s, code="shed")
            return web.Response(status=status, headers=headers, body=body)
        event = b"data: " + errors.error_body(503, message, "shed") + b"\n\n"
        with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
            await response.write(event)
        return response

    async def _relay_events(
        self,
        up: aiohttp.ClientResponse,
        response: web.StreamResponse,
        relay: Relay,
        started: float,
        client_wants_usage: bool,
    ) -> None:
        """Relay each event (lines up to a blank line: ``\\n`` or ``\\r\\n``) as soon as it is complete."""
        pending = b""
        scan = 0  # where the next unread line starts in ``pending``
        async for chunk in up.content.iter_any():
            pending += chunk
            start = 0
            while (newline := pending.find(b"\n", scan)) >= 0:
                if newline == scan or (newline == scan + 1 and pending[scan] == 13):  # a blank line ends the event
                    await self._relay_event(pending[start : newline + 1], response, relay, started, client_wants_usage)
                    start = newline + 1
                scan = newline + 1
            pending, scan = pending[start:], scan - start
        if pending:
            await self._relay_event(pending, response, relay, started, client_wants_usage)
        relay.completion = Completion.SUCCESS

    async def _relay_event(
        self, event: bytes, response: web.StreamResponse, relay: Relay, started: float, client_wants_usage: bool
    ) -> None:
        if event.startswith((b"data: [DONE]", b"data:[DONE]")):
            relay.finished = True
        elif event.startswith(b"data:"):  # the space after the colon is optional in SSE
            if b'"error"' in event:
                _note_error_event(relay, event[len(b"data:") :])
            if not relay.finished and b'"finish_reason"' in event and _FINISH_REASON.search(event):
                relay.finished = True
            if relay.ttft_s is None:
                relay.ttft_s = self._clock() - started
                if relay.on_first_event is not None:
                    relay.on_first_event(relay.ttft_s)
            self._note_progress()
            if b'"usage"' in event and b'"usage":null' not in event and b'"usage": null' not in event:
                try:
                    doc = json.loads(event[len(b"data:") :])
                except ValueError:
                    doc = None
                if isinstance(doc, dict) and not doc.get("choices"):
                    total = _usage_total(doc)
                    if total is not None:
                        relay.used_tokens, relay.usage_reported, relay.usage_final = total, True, True
                        if not client_wants_usage:
                            return  # the usage chunk we asked for on the client's behalf
                elif isinstance(doc, dict) and not relay.usage_final:
                    _note_choice_usage(relay, doc)  # relayed as is: it carries content or a finish_reason
            relay.chunks += 1
        try:
            await response.write(event)
        except (ConnectionError, aiohttp.ClientConnectionResetError) as exc:
            raise _ClientGone from exc

    async def pass_through(self, request: web.Request) -> web.StreamResponse:
        """Relay any other request unchanged (method, path, query, headers, body) and stream the answer."""
        assert self.session is not None, "Forwarder.start() first"
        url = self.upstream + request.rel_url.raw_path_qs
        data = request.content if request.body_exists else None
        try:
            async with self.session.request(
                request.method, url, headers=request_headers(request.headers), data=data
            ) as up:
                response = web.StreamResponse(status=up.status, headers=_response_headers(up.headers.items()))
                await response.prepare(request)
                async for chunk in up.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientError as exc:
            return web.Response(
                status=502, headers={"Content-Type": "application/json"},
                body=errors.error_body(502, f"model server unreachable: {type(exc).__name__}", "upstream_error"),
            )  # fmt: skip


def _response_headers(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {k: v for k, v in items if k.lower() not in HOP_BY_HOP}


def _upstream_error(up: aiohttp.ClientResponse, data: bytes) -> web.Response:
    """An upstream 5xx answer for the client: same status, an OpenAI error body (module docstring)."""
    text = data.decode("utf-8", "replace").strip()
    try:
        doc: Any = json.loads(text) if text else None
    except (ValueError, RecursionError):
        doc = text  # not JSON: the text is the message
    if isinstance(doc, dict):
        inner = doc.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return web.Response(status=up.status, body=data, headers=_response_headers(up.headers.items()))
        doc = inner if isinstance(inner, str) else doc.get("message", doc.get("detail"))  # TGI, vLLM, FastAPI
    message = doc.strip() if isinstance(doc, str) else ""
    if not text:
        message = f"the model server answered HTTP {up.status} with an empty body"
    elif not message or len(message) > MAX_RELAYED_MESSAGE_CHARS:
        message = f"the model server answered HTTP {up.status} ({len(data)} bytes of {up.content_type}, not shown)"
    headers = {k: v for k, v in _response_headers(up.headers.items()).items() if k.lower() not in _REPLACED_HEADERS}
    headers["Content-Type"] = "application/json"
    return web.Response(status=up.status, headers=headers, body=errors.error_body(up.status, message, "upstream_error"))


async def _stream_error(response: web.StreamResponse, status: int, message: str, code: str) -> web.StreamResponse:
    """End a stream the upstream broke with an SSE error event, so the client never mistakes a
    truncated answer for a complete one (the HTTP status was already sent as 200)."""
    with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
        await response.write(b"data: " + errors.error_body(status, message, code) + b"\n\n")
        await response.write_eof()
    return response


def _honest_retry_headers(response: web.Response, upstream_value: str | None) -> None:
    """An upstream 429/503 relayed with the same retry contract as our own: ``Retry-After`` in whole
    seconds >= 1 and ``retry-after-ms`` (OpenAI SDKs read both). An HTTP date (RFC 9110) counts
    from now; a value past :data:`MAX_RELAYED_RETRY_S` is capped there; garbage is the floor."""
    value = upstream_value or "1"
    try:
        delay = float(value)
    except ValueError:
        try:
            delay = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):  # garbage: the conservative floor
            delay = 1.0
    seconds = 1 if math.isnan(delay) else math.ceil(min(max(delay, 1.0), MAX_RELAYED_RETRY_S))
    response.headers["Retry-After"] = str(seconds)
    response.headers["retry-after-ms"] = str(seconds * 1000)
