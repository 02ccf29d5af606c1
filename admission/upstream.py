"""A lean keep-alive HTTP/1.1 client to the model server, for the admitted path only.

Why not ``aiohttp.ClientSession``: on one core its per-request cost (URL and header objects,
tracing hooks, cookie jar, payload registry, stream reader) was about 100-150 µs, more than all of
admission together; this client writes one buffer and parses the answer with ``httptools`` (the
llhttp parser uvicorn uses), about 15 µs (``bench/admission_proxy.py``). Everything else the
sidecar sends upstream (pass-through, ``/tokenize``, telemetry) stays on aiohttp.

Contract (what :class:`~tidegate.admission.proxy.Forwarder` relies on):

- one request per connection at a time; a connection goes back to the idle pool only when its
  answer was read to the end and the server allows keep-alive (:meth:`UpstreamResponse.release`);
  :meth:`UpstreamResponse.close` drops it, which is how a backend learns to abort a generation;
- a deadline covers the whole exchange (connect, head, body): past it the connection is dropped
  and the waiting call raises :class:`TimeoutError`;
- connect failures, a connection lost before the answer ended, and unparseable answers raise
  :class:`UpstreamError` (never a bare ``OSError``);
- body chunks are handed over as they arrive (no coalescing, for SSE); reading pauses while more
  than :data:`READ_HIGH_WATER_BYTES` wait for a slow client;
- idle connections the server closed are noticed (``connection_lost``) and never reused.
"""

import asyncio
import ssl
import urllib.parse
from collections import deque

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

READ_HIGH_WATER_BYTES = 256 * 1024
MAX_IDLE_CONNECTIONS = 256


class UpstreamError(Exception):
    """The model server could not be reached, or broke the connection or the answer."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: writes a request, parses its answer (``httptools`` callbacks)."""

    __slots__ = (
        "_body",
        "_buffered",
        "_complete",
        "_error",
        "_head",
        "_headers",
        "_keep_alive",
        "_loop",
        "_parser",
        "_paused",
        "_timer",
        "_waiter",
        "closed",
        "transport",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self._headers: list[tuple[str, str]] = []
        self._head: asyncio.Future[int] | None = None
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._complete = False
        self._keep_alive = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"unparseable answer from the model server: {exc}"))

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._complete or self._error is not None:
            return
        if self._head is not None and self._head.done() and self._eof_delimited():
            self.on_message_complete()  # a body delimited by the end of the connection
            return
        if self._head is not None or self._waiter is not None:
            self._fail(UpstreamError("the model server closed the connection" + (f": {exc}" if exc else "")))

    # ---- httptools callbacks ----

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        head = self._head
        if head is not None and not head.done():
            head.set_result(self._parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > READ_HIGH_WATER_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake()

    # ---- internals ----

    def _eof_delimited(self) -> bool:
        names = {name.lower() for name, _ in self._headers}
        return "content-length" not in names and "transfer-encoding" not in names

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        head, waiter = self._head, self._waiter
        if head is not None and not head.done():
            head.set_exception(error)
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_exception(error)
        self.abort()

    def _on_deadline(self) -> None:
        self._timer = None
        self._fail(TimeoutError("the model server did not finish in time"))

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def send(self, data: bytes, deadline: float) -> asyncio.Future[int]:
        """Write one request; the returned future resolves to the answer's status code."""
        self._reset()
        self._head = self._loop.create_future()
        self._timer = self._loop.call_at(deadline, self._on_deadline)
        assert self.transport is not None
        self.transport.write(data)
        return self._head

    async def read_chunk(self) -> bytes:
        """The next body chunk as it arrived, or ``b""`` at the end of the answer."""
        while not self._body:
            if self._error is not None:
                raise self._error
            if self._complete:
                return b""
            self._waiter = self._loop.create_future()
            await self._waiter
        chunk = self._body.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered <= READ_HIGH_WATER_BYTES // 4 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    def reusable(self) -> bool:
        return self._complete and self._keep_alive and self._error is None and not self.closed

    def finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class UpstreamResponse:
    """The head of an answer, and its body read whole or chunk by chunk."""

    __slots__ = ("_conn", "_headers", "_pool", "content_type", "status")

    def __init__(self, pool: "UpstreamPool", conn: _Connection, status: int, headers: list[tuple[str, str]]) -> None:
        self._pool, self._conn, self.status = pool, conn, status
        self._headers = headers
        self.content_type = "application/octet-stream"
        for name, value in headers:
            if name.lower() == "content-type":
                self.content_type = value.split(";", 1)[0].strip().lower()
                break

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        """Response headers, case-insensitive, in the order received."""
        return CIMultiDictProxy(CIMultiDict(self._headers))

    @property
    def header_items(self) -> list[tuple[str, str]]:
        """Response headers as received (name, value) pairs."""
        return self._headers

    async def read_chunk(self) -> bytes:
        """The next body chunk, ``b""`` at the end (raises :class:`UpstreamError` / :class:`TimeoutError`)."""
        return await self._conn.read_chunk()

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while chunk := await self._conn.read_chunk():
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Done with the answer: the connection is pooled if it was read to the end, else dropped."""
        conn, self._conn = self._conn, None  # type: ignore[assignment]
        if conn is not None:
            self._pool._give_back(conn)

    def close(self) -> None:
        """Drop the connection (the backend sees the client go and aborts the generation)."""
        conn, self._conn = self._conn, None  # type: ignore[assignment]
        if conn is not None:
            conn.finish()
            conn.abort()


class UpstreamPool:
    """Keep-alive connections to one ``http://`` or ``https://`` base URL (see the module docstring)."""

    def __init__(self, base_url: str) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"upstream must be an http(s) URL, got {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if url.scheme == "https" else None
        self.base_path = url.path.rstrip("/")
        self._host_header = b"Host: " + url.netloc.encode("idna") + b"\r\n"
        self._idle: list[_Connection] = []
        self._closed = False

    async def request(
        self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes, timeout_s: float
    ) -> UpstreamResponse:
        """Send one request (``path`` under the base URL's path, already encoded; ``headers`` without Host and
        Content-Length) and wait for the head of the answer. Raises :class:`UpstreamError` or
        :class:`TimeoutError`; on cancellation the connection is dropped."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        conn = self._take()
        if conn is None:
            conn = await self._connect(loop, deadline)
        head = [f"{method} {self.base_path}{path} HTTP/1.1\r\n".encode(), self._host_header]
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"Content-Length: %d\r\n\r\n" % len(body))
        head.append(body)
        try:
            status = await conn.send(b"".join(head), deadline)
        except BaseException:
            conn.finish()
            conn.abort()
            raise
        return UpstreamResponse(self, conn, status, conn._headers)

    def _take(self) -> _Connection | None:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, deadline: float) -> _Connection:
        try:
            async with asyncio.timeout_at(deadline):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop), self.host, self.port, ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None,
                )  # fmt: skip
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {self.host}:{self.port}: {type(exc).__name__}") from exc
        return conn

    def _give_back(self, conn: _Connection) -> None:
        conn.finish()
        if conn.reusable() and not self._closed and len(self._idle) < MAX_IDLE_CONNECTIONS:
            conn._reset()
            self._idle.append(conn)
        else:
            conn.abort()

    def close(self) -> None:
        """Drop every idle connection; connections in use are dropped when released."""
        self._closed = True
        for conn in self._idle:
            conn.abort()
        self._idle.clear()
