"""Reading the model server over HTTP: health, load signals and capacity, loudly when they fail.

The poller has its own client session, separate from the proxy's: the proxy must pass bodies
through byte for byte (``auto_decompress=False``), while a metrics page may come gzipped: vLLM
serves ``/metrics`` with prometheus_client's ASGI app, which compresses whenever the request
accepts gzip (``prometheus_client.exposition.gzip_accepted``), and aiohttp asks for it by default.
This session decompresses. Paths come from the config (``server.metricsPath``, ``healthPath``).

Every read that fails is a :class:`~tidegate.admission.telemetry.Problem` under a *source*
(``metrics``: the load signals; ``capacity``: ``/slots``, ``/props``, ``/info`` or vLLM's
``cache_config_info``). :class:`Episodes` turns them into operator-visible state: a WARNING when a
source starts failing (once per episode, however long it lasts), an INFO when it reads cleanly
again, :attr:`Episodes.error` for ``/tidegate/stats`` and an ``on_problem(source, kind)`` callback
per failed read for ``tidegate_admission_telemetry_errors_total``. What a failing signal does to
admission is the gate's business (``telemetry.onStale``, :mod:`tidegate.admission.gate`).

Capacity can change only when the model server restarts (another ``--parallel``/``--ctx-size``,
another GPU), so llama.cpp's and TGI's are read every :data:`~tidegate.admission.telemetry.CAPACITY_REFRESH_S`
(60 s) and again at the next read after a sign of a restart: the health check turning healthy
again (:meth:`BackendPoller.refresh_capacity`, called by the sidecar) or the server's progress
counter going backwards. vLLM's comes with every metrics page.
"""

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from tidegate.admission import telemetry
from tidegate.admission.engine import BackendCapacity, Telemetry
from tidegate.admission.telemetry import ErrorKind, Problem, TelemetryError
from tidegate.api.serving import Engine as BackendEngine

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 2.0
_SNIPPET_CHARS = 200
_ERROR_CHARS = 1000


class Episodes:
    """Problems by source; logs a WARNING when a source starts failing and an INFO when it recovers."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self.current: dict[str, list[Problem]] = {}
        self._log = logger

    def update(self, source: str, problems: list[Problem]) -> None:
        """The outcome of one read of ``source`` (no problems: it read cleanly)."""
        had = source in self.current
        if problems:
            self.current[source] = problems
            if not had:
                self._log.warning(
                    "backend %s unreadable: %s; admission goes on without it (telemetry.onStale applies once "
                    "the last good reading is stale)", source, _join(problems),
                )  # fmt: skip
        elif had:
            del self.current[source]
            self._log.info("backend %s read again", source)

    @property
    def ok(self) -> bool:
        """Whether every source read cleanly last time."""
        return not self.current

    @property
    def error(self) -> str | None:
        """What is wrong now, one line (None when :attr:`ok`)."""
        if not self.current:
            return None
        text = "; ".join(f"{source}: {_join(problems)}" for source, problems in sorted(self.current.items()))
        return text[:_ERROR_CHARS]


def _join(problems: list[Problem]) -> str:
    return ", ".join(p.message for p in problems)


class BackendPoller:
    """Reads one model server (see the module docstring). ``on_problem(source, kind)`` is called once
    per problem of every read; ``clock`` times the capacity refresh."""

    def __init__(
        self,
        upstream: str,
        engine: BackendEngine,
        *,
        metrics_path: str = "/metrics",
        health_path: str = "/health",
        clock: Callable[[], float],
        on_problem: Callable[[str, ErrorKind], None] | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.clock = clock
        self.on_problem = on_problem
        self.episodes = Episodes()
        self.engine: BackendEngine | None = None
        self.capacity: BackendCapacity | None = None
        self._capacity_due_s = 0.0
        self._progress_total: float | None = None  # the last progress counter read (a drop: a restart)
        self._props_noted = False
        self._session: aiohttp.ClientSession | None = None
        self.configure(engine, metrics_path, health_path)

    def configure(self, engine: BackendEngine, metrics_path: str, health_path: str) -> None:
        """New settings (a config reload); another engine forgets the capacity and problems read so far."""
        if engine is not self.engine:
            self.capacity, self._capacity_due_s, self._progress_total = None, 0.0, None
            self.episodes.current.clear()
        self.engine, self.metrics_path, self.health_path = engine, metrics_path, health_path

    def refresh_capacity(self) -> None:
        """Read the capacity again at the next :meth:`read`, whenever it was last read: the server
        may have restarted with another shape (the sidecar calls this when it turns healthy again)."""
        self._capacity_due_s = 0.0

    async def start(self) -> None:
        """Open the session (decompressing; a small pool: one poll at a time)."""
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=4), timeout=aiohttp.ClientTimeout(total=READ_TIMEOUT_S)
        )

    async def close(self) -> None:
        """Close the session (idempotent)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def healthy(self) -> bool:
        """Whether the health path answers below 500 (llama.cpp answers 503 while loading)."""
        try:
            async with self._http().get(self.upstream + self.health_path) as resp:
                return resp.status < 500
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def read(self, *, served_any: bool) -> Telemetry:
        """One reading of the load signals, with the capacity known so far (read again when due);
        problems are recorded (:attr:`episodes`, ``on_problem``). ``served_any``: a request has
        completed through this server (see :func:`~tidegate.admission.telemetry.parse_backend_metrics`)."""
        assert self.engine is not None
        signals = telemetry.SIGNALS[self.engine]
        if not signals.queued and not signals.kv_usage:
            return Telemetry()  # an engine whose metrics are not read (openai)
        problems: list[Problem] = []
        page_read = False
        try:
            text = await self._get_text(self.metrics_path)
            reading = await asyncio.to_thread(
                telemetry.parse_backend_metrics, text, self.engine, problems, served_any=served_any
            )
            page_read = True
        except TelemetryError as exc:
            problems, reading = [exc.problem], Telemetry()
        except ValueError as exc:  # prometheus_client's parser: not exposition format
            problems, reading = [Problem(ErrorKind.UNPARSABLE, f"GET {self.metrics_path}: {exc}")], Telemetry()
        self._record("metrics", [p for p in problems if p.source == "metrics"])
        total = reading.generation_tokens_total
        if total is not None:
            if self._progress_total is not None and total < self._progress_total:
                self.refresh_capacity()  # a counter that went backwards: the server restarted
            self._progress_total = total
        if signals.capacity_info is not None:  # vLLM: capacity comes with every page
            if page_read:
                self.capacity = reading.capacity or self.capacity
                self._record("capacity", [p for p in problems if p.source == "capacity"])
        elif self.clock() >= self._capacity_due_s:
            await self._read_capacity()
        return reading if self.capacity is None else dataclasses.replace(reading, capacity=self.capacity)

    async def _read_capacity(self) -> None:
        """llama.cpp ``/slots``, else ``/props``; TGI ``/info``. The last good capacity is kept on failure."""
        try:
            if self.engine is BackendEngine.LLAMACPP:
                capacity = await self._llamacpp_capacity()
            elif self.engine is BackendEngine.TGI:
                capacity = telemetry.parse_tgi_info(await self._get_json("/info"))
            else:
                return
        except TelemetryError as exc:
            self._capacity_due_s = self.clock() + telemetry.CAPACITY_RETRY_S
            self._record("capacity", [exc.problem])
            return
        self.capacity, self._capacity_due_s = capacity, self.clock() + telemetry.CAPACITY_REFRESH_S
        self._record("capacity", [])

    async def _llamacpp_capacity(self) -> BackendCapacity:
        try:
            return telemetry.parse_llamacpp_slots(await self._get_json("/slots"))
        except TelemetryError as slots_error:
            if slots_error.problem.kind is not ErrorKind.HTTP_STATUS:
                raise
            try:  # --no-slots: 501, and /props has the same numbers
                capacity = telemetry.parse_llamacpp_props(await self._get_json("/props"))
            except TelemetryError as props_error:
                message = f"{slots_error.problem.message}; {props_error.problem.message}"
                raise TelemetryError(props_error.problem.kind, message, "capacity") from props_error
            if not self._props_noted:
                self._props_noted = True
                log.info("%s; slot capacity read from GET /props instead", slots_error.problem.message)
            return capacity

    def _record(self, source: str, problems: list[Problem]) -> None:
        if self.on_problem is not None:
            for problem in problems:
                self.on_problem(source, problem.kind)
        self.episodes.update(source, problems)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("BackendPoller.start() was not awaited")
        return self._session

    async def _get_text(self, path: str) -> str:
        """The body of ``GET path`` as text (decompressed). Raises :class:`TelemetryError`."""
        source = "metrics" if path == self.metrics_path else "capacity"
        try:
            async with self._http().get(self.upstream + path) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    said = _said(raw, resp.content_type)
                    raise TelemetryError(ErrorKind.HTTP_STATUS, f"GET {path}: HTTP {resp.status}{said}", source)
                charset = resp.charset or "utf-8"
        except aiohttp.ClientPayloadError as exc:  # a body its Content-Encoding does not decode
            raise TelemetryError(ErrorKind.UNDECODABLE, f"GET {path}: body not decodable: {exc}", source) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TelemetryError(ErrorKind.UNREACHABLE, f"GET {path}: {type(exc).__name__}: {exc}", source) from exc
        try:
            return raw.decode(charset)
        except (UnicodeDecodeError, LookupError) as exc:
            raise TelemetryError(ErrorKind.UNDECODABLE, f"GET {path}: body is not {charset} text", source) from exc

    async def _get_json(self, path: str) -> Any:
        text = await self._get_text(path)
        try:
            return json.loads(text)
        except ValueError as exc:
            raise TelemetryError(ErrorKind.UNPARSABLE, f"GET {path}: not JSON", "capacity") from exc


def _said(raw: bytes, content_type: str) -> str:
    """What an error answer said, short: an OpenAI/llama.cpp error message, else the text's start."""
    text = raw[:4096].decode("utf-8", "replace").strip()
    if "json" in content_type:
        try:
            doc = json.loads(text)
            error = doc.get("error") if isinstance(doc, dict) else None
            message = error.get("message") if isinstance(error, dict) else error
            if isinstance(message, str):
                text = message
        except ValueError:
            pass
    return f" ({text[:_SNIPPET_CHARS]})" if text else ""
