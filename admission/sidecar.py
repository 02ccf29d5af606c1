"""The admission sidecar process: HTTP front, engine driving, background loops, draining.

Routes:

- ``POST /v1/chat/completions``, ``POST /v1/completions``: through admission (see
  :mod:`tidegate.admission.engine`), then :class:`~tidegate.admission.proxy.Forwarder`;
- ``GET /metrics`` (:mod:`tidegate.admission.metrics`), ``GET /tidegate/stats``
  (:class:`~tidegate.admission.stats.StatsSnapshot`), ``POST /tidegate/drain`` (what a preStop
  hook calls), ``GET /healthz`` (the process serves), ``GET /readyz`` (a serving role, not
  draining, backend healthy, sized: never "has spare capacity", so overload sheds with 429/503 while
  the pod stays in the Service), ``GET /tidegate/ready`` (sized, whatever the role: the pod's
  readiness; 503 while an unset ``tokenBudget`` / ``maxConcurrency`` is still being read from the
  model server, during which admitted paths answer 503 ``not_active``; see
  :mod:`tidegate.admission.sizing`);
- ``POST /chat/completions`` (llama.cpp's alias) and other spellings of the two paths above
  (trailing slash, case, percent-encoding) are admitted as those paths; the model servers' other
  generation routes (``/generate``, ``/completion``, ``/v1/responses``, ``/invocations``, ...) are
  refused with 403 ``path_not_admitted`` (:mod:`tidegate.admission.paths`);
- everything else is passed through to the model server untouched.

Tenant identity (``tenancy.identity``): ``header`` takes the header's value (absent or empty: the
tenant ``default``, or under ``requireIdentity`` a 400 naming the header); ``apiKey`` maps the
bearer key (unknown: 401); ``none`` is ``default``. How unlisted names share the default policy is
the engine's (:mod:`tidegate.admission.tenants`).

Errors the sidecar answers itself are OpenAI error documents, aiohttp's own ones included
(:func:`openai_http_errors`: an unroutable path is 404 ``not_found``; a wrong method on one of the
paths above is 405 ``method_not_allowed`` with ``Allow``, never forwarded).

Background loops: a ticker (every ``tick_s``: queue expiry, stall check, dispatch; every
``reload_s``: config file and the role and serving labels), and telemetry (every ``telemetry.pollIntervalMs``: the
backend's ``server.healthPath``, then while healthy its load signals and capacity through
:class:`~tidegate.admission.poller.BackendPoller`, and NVML). A signal that cannot be read is
logged once per episode, counted in ``tidegate_admission_telemetry_errors_total`` and shown in
``/tidegate/stats`` (``telemetry_ok``, ``telemetry_error``). A backend that turns healthy again has
its capacity read again at once (a restart may have changed its shape; an unset budget or
concurrency follows it, :meth:`~tidegate.admission.engine.Engine.observe_telemetry`).

Release exactly once: the admitted path releases its ticket in one ``finally``; a handler
cancelled while queued (the client went away; aiohttp cancels handlers on disconnect) cancels
its ticket, which is then never dispatched.

Slow clients: the body of an admitted path must arrive within ``bodyReadTimeoutSeconds`` of the
handler starting (a total deadline, so trickling a byte at a time does not extend it), else 408
``body_read_timeout`` and the connection is closed (after a lingering close of at most
:data:`LINGER_S`, so the answer reaches a client that is still sending). Nothing is reserved before
the body is read.

Roles: requests are taken in the ``active`` role, and in the ``warm`` one when the pod's
``tidegate.dev/serving`` label is ``"true"`` (``spec.warmPool.serve``: the Service sends warm pods
requests too); otherwise 503 ``not_active``. Both are read from the downward-API labels file and
from the operator's push (``PUT /tidegate/role``), which holds until the file changes (``push_hold_s`` at most).

Draining (SIGTERM, or ``POST``/``GET /tidegate/drain[?wait=true]`` from a preStop hook): new requests get 503 ``not_active`` with
``Retry-After: 1``, readiness turns false, queued and in-flight requests finish; on SIGTERM the
process exits once nothing is in flight or after the grace period.
"""

import asyncio
import contextlib
import dataclasses
import hmac
import ipaddress
import json
import logging
import signal
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from tidegate.admission import errors, metrics, paths, poller, sizing, stats, telemetry
from tidegate.admission.breaker import Completion
from tidegate.admission.config import ApiKeys, ConfigWatcher, PodLabels, SidecarConfig, SidecarSettings, read_labels
from tidegate.admission.cost import CHAT_PATH, COMPLETIONS_PATH, CostError
from tidegate.admission.engine import BackendCapacity, Engine, EngineTuning, Telemetry
from tidegate.admission.proxy import Forwarder, Relay
from tidegate.admission.reasons import Reason
from tidegate.admission.sizing import Source
from tidegate.admission.ticket import Ticket, TicketState
from tidegate.api.admission import TenantIdentitySource
from tidegate.api.constants import ROLE_ACTIVE, ROLE_WARM, ROLES
from tidegate.api.serving import Engine as BackendEngine
from tidegate.api.serving import PromptTokenizer

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_TENANT_CHARS = 128  # as the API's tenant names: a header cannot grow the counters without bound per key


DRAIN_TOKEN_HEADER = "X-Tidegate-Drain-Token"


def _loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


def _forbidden(message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "forbidden", "code": "forbidden", "param": None}}, status=403
    )


def _header(request: web.Request, name: str) -> str | None:
    """A header value as valid UTF-8: aiohttp keeps undecodable bytes as surrogates, which would
    later break every ``/metrics`` scrape once such a value became a label; they become U+FFFD."""
    value = request.headers.get(name)
    if value is None or value.isascii():
        return value
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@web.middleware
async def openai_http_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own HTTP errors (the router's 404 and 405, ...) in the OpenAI error shape instead
    of plain text; ``Allow`` and the status are kept. Errors already in JSON pass unchanged."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        code = _HTTP_ERROR_CODES.get(exc.status, "http_error")
        message = f"{exc.reason}: {request.method} {request.path[:200]}"
        headers = {"Content-Type": "application/json"}
        if "Allow" in exc.headers:
            headers["Allow"] = exc.headers["Allow"]
        return web.Response(status=exc.status, headers=headers, body=errors.error_body(exc.status, message, code))


_HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_body_too_large"}


LINGER_S = 1.0
"""After the slow-loris 408: how long the sidecar reads and drops what a client still sends, its
side already shut, before it closes (aiohttp's own lingering would read for 10 s)."""


async def _linger(request: web.Request) -> None:
    """Shut our side of the connection (the client reads the answer, then end of stream), and read
    and drop what it still sends for up to :data:`LINGER_S`, or until it closes: closing a socket
    with unread input makes the kernel send a reset, which can reach the client before it has read
    the answer and throw it away (the usual "lingering close" of HTTP servers, RFC 9112 9.6)."""
    transport = request.transport
    if transport is None or transport.is_closing() or not transport.can_write_eof():
        return
    transport.write_eof()
    with contextlib.suppress(TimeoutError, aiohttp.ClientPayloadError, ConnectionError):
        async with asyncio.timeout(LINGER_S):
            while await request.content.readany():
                pass


class BodyTooLarge(Exception):
    """The request body is over ``maxRequestBytes``."""


async def read_limited(request: web.Request, limit: int) -> bytes:
    """The request body, refusing (:class:`BodyTooLarge`) as soon as it passes ``limit`` bytes."""
    if request.content_length is not None:
        if request.content_length > limit:
            raise BodyTooLarge
        return await request.read()  # the declared length is within the limit: one read
    parts, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        parts.append(chunk)
    return b"".join(parts)


class Sidecar:
    """One sidecar: the engine, its HTTP app and its background loops."""

    def __init__(
        self,
        settings: SidecarSettings,
        config: SidecarConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        tuning: EngineTuning | None = None,
        nvml: telemetry.Nvml | None = None,
        watcher: ConfigWatcher | None = None,
    ) -> None:
        self.settings, self.config, self.clock = settings, config, clock
        self.engine = Engine(config.admission, config.model, clock, tuning)
        self.forwarder = Forwarder(settings.upstream, self.engine.note_progress, clock)
        self.nvml = nvml
        self.gpu: telemetry.GpuReading | None = None
        self.started_at_s = time.time()
        self.metrics = metrics.SidecarMetrics(
            config.pool, lambda: self.engine, lambda: self.gpu, started_at_s=self.started_at_s
        )
        self.poller = poller.BackendPoller(
            settings.upstream, config.model.engine, metrics_path=config.server.metrics_path,
            health_path=config.server.health_path, clock=clock, on_problem=self.metrics.telemetry_problem,
        )  # fmt: skip
        self.metrics.telemetry_up_child.set_function(lambda: float(self.poller.episodes.ok))
        self.metrics.configure(
            config.admission.tenancy.metrics_top_tenants,
            [t.name for t in config.admission.tenancy.tenants],
            [c.name for c in config.admission.priority_classes],
        )
        self.watcher = watcher
        labels = read_labels(settings.labels_file)
        self.role = labels.role
        self.in_service = labels.serving  # the tidegate.dev/serving label; None: not labelled
        # A role and serving state pushed by the operator (PUT /tidegate/role), with the file's at that
        # moment and when: it holds until the labels file changes (the kubelet refreshes it only on its
        # sync), or for settings.push_hold_s at most (a lost push must not hold for good).
        self._pushed: tuple[PodLabels, PodLabels, float] | None = None
        self.api_keys = ApiKeys(settings.api_keys_dir)
        self.draining = False
        self.backend_healthy = True
        self.config_warnings: list[str] = []  # where the config promises more than the server holds
        self._sized = asyncio.Event()  # set while the budget and concurrency are known (not pending)
        self._note_sizing()
        self.instance_id = uuid.uuid4().hex
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._running: dict[int, tuple[asyncio.Task[object], Relay]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self._own_paths: dict[str, set[str]] = {}
        self.url = ""

    # ---- app and lifecycle ----------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3, middlewares=[openai_http_errors])
        app.router.add_post(CHAT_PATH, self._chat)
        app.router.add_post(COMPLETIONS_PATH, self._completions)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get(stats.STATS_PATH, self._stats)
        app.router.add_post("/tidegate/drain", self._drain)
        app.router.add_get("/tidegate/drain", self._drain)  # a preStop httpGet hook
        app.router.add_put("/tidegate/role", self._push_role)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/tidegate/ready", self._pod_ready)
        for resource in app.router.resources():  # the sidecar's own paths: wrong methods are 405 here
            path = resource.get_info().get("path")
            if path is not None:
                self._own_paths.setdefault(path, set()).update(route.method for route in resource)
        app.router.add_route("*", "/{tail:.*}", self._pass_through)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        await self.forwarder.start()
        await self.poller.start()
        self._tasks = [asyncio.create_task(self._tick_loop()), asyncio.create_task(self._telemetry_loop())]

    async def _on_cleanup(self, _app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.forwarder.close()
        await self.poller.close()
        if self.nvml is not None:
            self.nvml.close()

    async def start(self, host: str | None = None, port: int | None = None) -> str:
        """Serve on ``host:port`` (port 0: any free port); returns the base URL."""
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, host or self.settings.listen_host, self.settings.listen_port if port is None else port
        )
        try:
            await site.start()
        except OSError:  # e.g. the port is taken: close what startup opened (the upstream sessions)
            await self.stop()
            raise
        bound = self._runner.addresses[0]
        self.url = f"http://{bound[0]}:{bound[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def drain_and_wait(self, grace_s: float) -> bool:
        """Start draining and wait until nothing is queued or in flight; False if the grace ran out."""
        self.draining = True
        deadline = self.clock() + grace_s
        while self.engine.in_flight_requests or self.engine.queue.depth:
            if self.clock() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    # ---- the admitted path ----------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._admitted(request, CHAT_PATH)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._admitted(request, COMPLETIONS_PATH)

    def _tenant(self, request: web.Request) -> str | None:
        tenancy = self.engine.admission.tenancy
        if tenancy.identity is TenantIdentitySource.HEADER:
            return (_header(request, tenancy.header) or "default")[:MAX_TENANT_CHARS]
        if tenancy.identity is TenantIdentitySource.API_KEY:
            return self.api_keys.tenant(request.headers.get("Authorization"))  # None: 401, never a guess
        return "default"

    async def _admitted(self, request: web.Request, path: str) -> web.StreamResponse:
        arrival = self.clock()
        engine = self.engine
        admission = engine.admission
        priority = _header(request, admission.priority_header)
        tenancy = admission.tenancy
        if tenancy.identity is TenantIdentitySource.HEADER and len(set(request.headers.getall(tenancy.header, ()))) > 1:
            return self._refuse(  # a client's value and a gateway's appended one: never guess which is true
                "unknown", priority, Reason.BAD_REQUEST,
                f"the tenant header {tenancy.header!r} was sent more than once with different values",
                param=tenancy.header,
            )  # fmt: skip
        if (
            tenancy.identity is TenantIdentitySource.HEADER
            and tenancy.require_identity
            and not _header(request, tenancy.header)
        ):  # no identity is refused, not guessed: "default" is a name any client can also send
            return self._refuse(
                "unknown", priority, Reason.BAD_REQUEST,
                f"the tenant header {tenancy.header!r} is required (tenancy.requireIdentity) and was missing or empty",
                param=tenancy.header,
            )  # fmt: skip
        tenant = self._tenant(request)
        listed = _header(request, tenancy.header) if tenancy.identity is TenantIdentitySource.HEADER else None
        if listed is not None and "," in listed:  # the whole value: the 128-character cut could drop the comma
            return self._refuse(  # repeated headers merged into one by a proxy (RFC 9110 5.3): same as above
                "unknown", priority, Reason.BAD_REQUEST,
                f"the tenant header {tenancy.header!r} holds a list ({listed[:200]!r}); send one tenant",
                param=tenancy.header,
            )  # fmt: skip
        if tenant is None:
            return self._refuse("unknown", priority, Reason.UNAUTHORIZED, "missing or unknown API key")
        if engine.sizing.pending and self.role_serves and not self.draining:
            await self._await_sizing(admission.queue.max_wait_ms / 1000.0)
        if not self.serving:
            why = (
                "draining" if self.draining
                else f"in the {self.role!r} role, not serving" if not self.role_serves
                else "still reading the model server's capacity (admission.tokenBudget unset)"
            )  # fmt: skip
            return self._refuse(
                tenant, priority, Reason.NOT_ACTIVE, f"this replica is {why}; retry another", retry_s=1.0
            )
        early = engine.precheck(tenant, priority)
        if early is not None:  # the fast no: refused before the body is read or parsed
            self.metrics.decision(early)
            return self._rejection(early)
        try:
            if request.content.is_eof():  # the whole body is here already: nothing to wait for, no timer
                raw = await read_limited(request, admission.max_request_bytes)
            else:
                async with asyncio.timeout(admission.body_read_timeout_seconds):
                    raw = await read_limited(request, admission.max_request_bytes)
        except BodyTooLarge:
            return self._refuse(tenant, priority, Reason.REQUEST_TOO_LARGE,
                                f"request body over {admission.max_request_bytes} bytes", code="request_body_too_large")  # fmt: skip
        except TimeoutError:  # slow-loris: the connection is closed, its unread rest is never waited for
            response = self._refuse(
                tenant, priority, Reason.BAD_REQUEST, code=errors.BODY_READ_TIMEOUT,
                message=f"the request body did not arrive within {admission.body_read_timeout_seconds:g} s",
            )  # fmt: skip
            response.force_close()  # "Connection: close"; then close it ourselves, or aiohttp would linger
            await response.prepare(request)  # reading the rest of the body for up to 10 s
            await response.write_eof()
            await _linger(request)
            request.protocol.force_close()
            return response
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return self._refuse(tenant, priority, Reason.BAD_REQUEST, "the request body is not valid JSON")
        except RecursionError:
            return self._refuse(tenant, priority, Reason.BAD_REQUEST, "the request body is nested too deeply")
        try:
            cost = engine.cost(path, body)
            if engine.model.tokenizer is PromptTokenizer.BACKEND and not cost.prompt_exact:
                exact = await self._count_prompt_tokens(path, body)
                if exact is not None:
                    cost = engine.cost(path, body, prompt_tokens=exact)
        except CostError as exc:
            return self._refuse(tenant, priority, exc.reason, exc.message, code=exc.code, param=exc.param)
        except RecursionError:
            return self._refuse(tenant, priority, Reason.BAD_REQUEST, "the request body is nested too deeply")

        ticket = engine.submit(tenant, priority, cost)
        self._wake_settled()  # a displaced request learns at once
        if ticket.state is TicketState.QUEUED:
            await self._wait_in_queue(ticket)
        self.metrics.decision(ticket)
        if ticket.state is TicketState.REJECTED:
            return self._rejection(ticket)

        relay = Relay()

        def first_event(ttft_s: float) -> None:
            engine.first_token(ticket, ttft_s)
            self._wake_settled()  # the prefill cap may let queued requests in

        relay.on_first_event = first_event
        forward = self.forwarder.forward(
            request, path, body, raw, stream=cost.stream, client_wants_usage=cost.include_usage,
            prompt_tokens=cost.prompt_tokens, timeout_s=float(admission.request_timeout_seconds), relay=relay,
        )  # fmt: skip
        if cost.stream or engine.model.engine is not BackendEngine.LLAMACPP:
            task = asyncio.current_task()
            if task is not None:
                self._running[ticket.id] = (task, relay)
            try:
                return await forward
            finally:
                self._finish(ticket, relay, arrival)
        # llama-server does not stop a non-streamed generation whose client went away (llama.cpp
        # 0c1e570, measured directly): its slot stays busy until the answer is complete, so the
        # reservation is held as long (bounded by requestTimeoutSeconds, the forwarder's timeout).
        upstream = asyncio.ensure_future(forward)
        self._running[ticket.id] = (upstream, relay)
        upstream.add_done_callback(lambda _: self._finish(ticket, relay, arrival))
        return await asyncio.shield(upstream)

    def _finish(self, ticket: Ticket, relay: Relay, arrival: float) -> None:
        """Release ``ticket`` with how its request ended, and record it (once per admitted request)."""
        engine = self.engine
        self._running.pop(ticket.id, None)
        engine.release(
            ticket, relay.completion, ttft_s=relay.ttft_s, used_tokens=relay.used_tokens,
            usage_reported=relay.usage_reported,
        )  # fmt: skip
        self._wake_settled()
        if not relay.usage_reported and relay.completion is Completion.SUCCESS:
            self.metrics.usage_missing_child.inc()
        self.metrics.upstream_response(relay.status)
        if relay.started_s:
            ttft = None if relay.ttft_s is None else relay.started_s - arrival + relay.ttft_s
            slo = engine._classes.get(ticket.priority)
            slo_s = slo[1].ttft_slo_ms / 1000.0 if slo else None
            self.metrics.finished(ticket, ttft, self.clock() - arrival, slo_s)

    async def _count_prompt_tokens(self, path: str, body: dict[str, Any]) -> int | None:
        """Exact prompt tokens from the backend's ``/tokenize`` (``tokenizer: backend``), None on any failure.

        vLLM (and the sim-backend): ``{"model", "messages"}`` (chat template applied) or
        ``{"model", "prompt"}`` -> ``{"count": N}``. llama.cpp (``tools/server/server-context.cpp``
        of the llama.cpp that llama-cpp-python 0.3.36 vendors): its ``/tokenize`` applies no chat
        template, so a chat is first rendered by ``POST /apply-template`` (``{"messages", ...}`` ->
        ``{"prompt"}``, the same rendering as its chat route), then counted by ``POST /tokenize``
        ``{"content", "add_special": true, "parse_special": true}`` -> ``{"tokens": [...]}``, the
        flags its completion routes tokenize prompts with. Falls back to the estimate.
        """
        model = self.engine.model
        if model.engine is BackendEngine.LLAMACPP:
            if path == CHAT_PATH:
                keys = ("messages", "tools", "tool_choice", "chat_template_kwargs", "add_generation_prompt")
                rendered = await self._backend_json("/apply-template", {k: body[k] for k in keys if k in body})
                prompt = rendered.get("prompt") if isinstance(rendered, dict) else None
            else:
                prompt = body.get("prompt")
            if not isinstance(prompt, str):
                return None
            doc: dict[str, Any] = {"content": prompt, "add_special": True, "parse_special": True}
        elif path == CHAT_PATH:
            doc = {"model": body.get("model") or model.name, "messages": body["messages"]}
        elif isinstance(body.get("prompt"), str):
            doc = {"model": body.get("model") or model.name, "prompt": body["prompt"]}
        else:
            return None
        answer = await self._backend_json("/tokenize", doc)
        count = answer.get("count") if isinstance(answer, dict) else None
        if not isinstance(count, int) and isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
            count = len(answer["tokens"])
        return count if isinstance(count, int) and count >= 0 else None

    async def _backend_json(self, path: str, doc: dict[str, Any]) -> Any:
        """POST ``doc`` to the model server's ``path``; its JSON answer, or None on any failure."""
        session = self.forwarder.session
        assert session is not None
        try:
            async with session.post(
                self.forwarder.upstream + path, json=doc, timeout=aiohttp.ClientTimeout(total=2.0)
            ) as resp:
                if resp.status != 200:
                    return None
                return await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def _wait_in_queue(self, ticket: Ticket) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[ticket.id] = future
        try:
            await future
        except asyncio.CancelledError:  # the client went away while queued
            self._waiters.pop(ticket.id, None)
            if ticket.state is TicketState.QUEUED:
                self.engine.cancel(ticket)
            elif ticket.state is TicketState.ADMITTED:  # admitted in the same instant
                self.metrics.decision(ticket)
                self.engine.release(ticket, Completion.CANCELLED)
            self._wake_settled()
            raise

    def _wake_settled(self, settled: list[Ticket] | None = None) -> None:
        """Wake the handlers of queued tickets that were admitted or refused."""
        for ticket in (settled or []) + self.engine.take_settled():
            future = self._waiters.pop(ticket.id, None)
            if future is not None and not future.done():
                future.set_result(None)

    def _note_sizing(self) -> None:
        if self.engine.sizing.pending:
            self._sized.clear()
        else:
            self._sized.set()

    async def _await_sizing(self, bound_s: float) -> None:
        """Hold a request that arrived before the model server's capacity was read (the pod is not
        ready then, but a client may call it directly) for up to ``bound_s``: the first read is
        normally one poll away; past the bound it is refused ``not_active``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound_s):
                await self._sized.wait()

    def _refuse(
        self, tenant: str, priority: str | None, reason: Reason, message: str, *,
        code: str | None = None, param: str | None = None, retry_s: float | None = None,
    ) -> web.Response:  # fmt: skip
        ticket = self.engine.refuse(tenant, priority, reason, message, code=code)
        ticket.retry_after_s = retry_s
        self.metrics.decision(ticket)
        return self._rejection(ticket, param)

    def _rejection(self, ticket: Ticket, param: str | None = None) -> web.Response:
        assert ticket.reason is not None
        status, headers, body = errors.rejection(
            ticket.reason, ticket.message, ticket.retry_after_s, ticket.code, param
        )
        return web.Response(status=status, headers=headers, body=body)

    # ---- operations endpoints ---------------------------------------------------------------

    @property
    def role_serves(self) -> bool:
        """Whether the pod's role takes requests: ``active``, or ``warm`` labelled ``serving=true``
        (``spec.warmPool.serve``). An active pod serves whatever its serving label says."""
        return self.role == ROLE_ACTIVE or (self.role == ROLE_WARM and self.in_service is True)

    @property
    def serving(self) -> bool:
        """Whether new requests are taken: a serving role (:attr:`role_serves`), not draining, and sized
        (an unset budget read from the model server, or its fallback: :mod:`tidegate.admission.sizing`)."""
        return self.role_serves and not self.draining and not self.engine.sizing.pending

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def _sizing_body(self) -> dict[str, object]:
        sizing = self.engine.sizing
        return {
            "sized": not sizing.pending,
            "token_budget_source": sizing.budget_source.value,
            "max_concurrency_source": sizing.concurrency_source.value,
        }

    async def _readyz(self, _request: web.Request) -> web.Response:
        ready = self.serving and self.backend_healthy
        body = {"ready": ready, "role": self.role, "serving_label": self.in_service, "draining": self.draining,
                "backend_healthy": self.backend_healthy}  # fmt: skip
        body |= self._sizing_body()
        return web.json_response(body, status=200 if ready else 503)

    async def _pod_ready(self, _request: web.Request) -> web.Response:
        """``GET /tidegate/ready``: the pod's readiness whatever its role (a warm pod must be Ready to
        count as warm): 503 while an unset token budget or concurrency is still being read from the
        model server, so a pod never joins the pool before it knows what it holds."""
        body = self._sizing_body()
        return web.json_response(body, status=200 if body["sized"] else 503)

    async def _pass_through(self, request: web.Request) -> web.StreamResponse:
        """Other paths go to the model server unchanged, except ones with dot or empty segments:
        a backend that normalises ``/v1/./chat/completions`` would serve it without admission, and
        the sidecar's own paths with another method (405 here: e.g. ``GET /v1/chat/completions``).
        Spellings and aliases of the admitted paths are admitted; the model servers' own generation
        routes are refused with 403 ``path_not_admitted`` (:mod:`tidegate.admission.paths`)."""
        raw_path = request.rel_url.raw_path
        segments = urllib.parse.unquote(raw_path).split("/")[1:]
        if any(seg in (".", "..") for seg in segments) or "" in segments[:-1]:
            body = errors.error_body(400, "paths with '.', '..' or empty segments are not accepted", "bad_request")
            return web.Response(status=400, body=body, content_type="application/json")
        admitted_as = paths.admitted_as(request.method, raw_path)
        if admitted_as is not None:  # an alias or spelling of an admitted path: the same admission
            return await self._admitted(request, admitted_as)
        allowed = self._own_paths.get(request.path)
        if allowed is not None:
            raise web.HTTPMethodNotAllowed(request.method, sorted(allowed))
        if paths.refused(request.method, raw_path):  # the backend's own generation routes: no bypass
            tenant = self._tenant(request) or "unknown"
            priority = _header(request, self.engine.admission.priority_header)
            message = paths.refusal_message(request.method, raw_path)
            return self._refuse(tenant, priority, Reason.BAD_REQUEST, message, code=errors.PATH_NOT_ADMITTED)
        return await self.forwarder.pass_through(request)

    def _trusted(self, request: web.Request) -> bool:
        """A control call from the pod itself (loopback) or from the operator (the drain token)."""
        token = self.config.drain_token
        offered = request.headers.get(DRAIN_TOKEN_HEADER, "")
        return _loopback(request.remote) or bool(token and hmac.compare_digest(offered.encode(), token.encode()))

    async def _push_role(self, request: web.Request) -> web.Response:
        """``PUT /tidegate/role`` ``{"role": "active"|"warm"|"draining", "serving": true|false}``: the
        operator's relabel (``serving``: the ``tidegate.dev/serving`` label, optional), applied at once.
        The downward-API labels file says the same later (the kubelet rewrites it only on its
        periodic sync, up to about a minute); until it changes, the push holds, for
        ``push_hold_s`` at most (a push the file never confirms was lost or reverted)."""
        if not self._trusted(request):
            return _forbidden("changing the role needs the pod's token")
        try:
            doc = await request.json()
            role, serving = doc["role"], doc.get("serving")
        except (ValueError, KeyError, TypeError, AttributeError):
            role, serving = None, None
        if role not in ROLES or not (serving is None or isinstance(serving, bool)):
            param = "role" if role not in ROLES else "serving"
            message = f"role must be one of {list(ROLES)}" if param == "role" else "serving must be true or false"
            return web.json_response(
                {"error": {"message": message, "type": "invalid_request_error", "code": "bad_request",
                           "param": param}},
                status=400,
            )  # fmt: skip
        self._pushed = (PodLabels(role, serving), read_labels(self.settings.labels_file), self.clock())
        self.role, self.in_service = role, serving
        return web.json_response({"role": self.role, "serving": self.serving, "draining": self.draining})

    async def _drain(self, request: web.Request) -> web.Response:
        """Start draining; with ``?wait=true`` answer only when nothing is queued or in flight
        (or the grace ran out), so a preStop hook holds SIGTERM back until then.

        Draining cannot be undone, and this port is the one the pool's Service sends clients to:
        only a caller with the config's ``drainToken`` (the pod's preStop hook) or a loopback
        caller may drain; anyone else gets 403.
        """
        if not self._trusted(request):
            return _forbidden("draining needs the pod's token")
        self.draining = True
        log.info("draining: refusing new requests, %d in flight", self.engine.in_flight_requests)
        done = True
        if request.query.get("wait", "").lower() in ("1", "true", "yes"):
            done = await self.drain_and_wait(self.drain_grace_s)
        body = {"draining": True, "done": done, "in_flight_requests": self.engine.in_flight_requests}
        return web.json_response(body)

    @property
    def drain_grace_s(self) -> float:
        """How long draining waits for in-flight requests (flag, else ``requestTimeoutSeconds``)."""
        if self.settings.drain_grace_s is not None:
            return self.settings.drain_grace_s
        return float(self.engine.admission.request_timeout_seconds)

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    async def _stats(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.snapshot().model_dump_json(), content_type="application/json")

    def snapshot(self) -> stats.StatsSnapshot:
        """The stats contract document (tenants beyond the metrics top-N summed under ``other``)."""
        engine, counters = self.engine, self.engine.counters
        top_n = engine.admission.tenancy.metrics_top_tenants
        ranked = sorted(
            counters.tenants.items(), key=lambda kv: -(kv[1].admitted + kv[1].capacity_rejected + kv[1].policy_rejected)
        )
        tenants: dict[str, stats.TenantCounters] = {}
        for i, (name, c) in enumerate(ranked):
            key = name if i < top_n else metrics.OTHER
            into = tenants.setdefault(key, stats.TenantCounters())
            for field in ("admitted", "admitted_tokens", "demoted", "capacity_rejected", "policy_rejected"):
                setattr(into, field, getattr(into, field) + getattr(c, field))
        age, capacity = engine.telemetry_age_s(), engine.backend_capacity or BackendCapacity()
        return stats.StatsSnapshot(
            pool=self.config.pool, pod=self.settings.pod, role="draining" if self.draining else self.role,
            serving=self.serving, instance_id=self.instance_id, started_at_s=self.started_at_s, time_s=time.time(),
            admitted_total=counters.admitted_total, admitted_demoted_total=counters.admitted_demoted_total,
            admitted_tokens_total=counters.admitted_tokens_total, completed_total=counters.completed_total,
            rejected_total=dict(counters.rejected_total), tenants=tenants,
            in_flight_requests=engine.in_flight_requests, in_flight_tokens=engine.in_flight_tokens,
            token_budget=None if engine.sizing.budget_source is Source.PENDING else engine.token_budget,
            max_concurrency=(
                None if engine.sizing.concurrency_source is Source.PENDING else engine.admission.max_concurrency
            ),
            sizing_changes_total=engine.sizing_changes,
            queue_depth=engine.queue.depth, breaker_state=stats.BreakerState(engine.breaker_state.value),
            shed_total=counters.shed_total,
            kv_cache_usage=engine.kv.value, telemetry_age_s=None if age is None else max(0.0, age),
            telemetry_ok=self.poller.episodes.ok, telemetry_error=self.poller.episodes.error,
            backend_requests_running=engine.backend_running, backend_requests_queued=engine.backend_queue.value,
            backend_queue_held=engine.backend_queue_held, backend_kv_capacity_tokens=capacity.kv_tokens,
            backend_slots=capacity.slots, backend_context_tokens=capacity.context_tokens,
            backend_max_requests=capacity.max_requests,
            config_warnings=self._warnings(), token_budget_source=engine.sizing.budget_source.value,
            max_concurrency_source=engine.sizing.concurrency_source.value,
        )  # fmt: skip

    def _warnings(self) -> list[str]:
        """:attr:`config_warnings`, and the fallback sizing while in force (the engine logs it once)."""
        fallback = sizing.describe(self.engine.sizing, self.engine.model.engine)
        return self.config_warnings + ([fallback] if fallback is not None else [])

    # ---- background loops ---------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        next_reload = self.clock()
        while True:
            await asyncio.sleep(self.settings.tick_s)
            try:
                self._wake_settled(self.engine.tick())
                self._note_sizing()
                self._shed_overdue()
                if self.clock() >= next_reload:
                    next_reload = self.clock() + self.settings.reload_s
                    self._reload()
            except Exception:  # a bug here must not stop expiry and dispatch for good
                log.exception("admission tick failed")

    def _shed_overdue(self) -> None:
        """Abort requests running far past their prediction (``shedAfterMultiple``; off by default)."""
        for ticket in self.engine.overdue():
            entry = self._running.get(ticket.id)
            if entry is not None and entry[1].shed_retry_s is None:
                task, relay = entry
                relay.shed_retry_s = max(1.0, self.engine.mean_duration_s / 2)
                self.engine.note_shed(ticket)
                self.metrics.shed(ticket)
                log.warning("shedding request %d of tenant %r: running %.1f s, predicted %.1f s", ticket.id,
                            ticket.tenant, self.clock() - (ticket.admitted_at_s or 0), self.engine.predicted_duration_s(ticket))  # fmt: skip
                task.cancel()

    def _reload(self) -> None:
        from_file = read_labels(self.settings.labels_file)
        pushed = self._pushed
        if pushed is not None and pushed[1] == from_file and self.clock() - pushed[2] >= self.settings.push_hold_s:
            # e.g. serve flipped off and on again within one kubelet sync, the second push lost: the
            # file never changes, and the stale push would refuse requests the Service keeps sending
            log.warning(
                "the pushed role %s (serving %s) was not confirmed by the labels file in %g s: following the "
                "file (role %s, serving %s)", pushed[0].role, pushed[0].serving, self.settings.push_hold_s,
                from_file.role, from_file.serving,
            )  # fmt: skip
            pushed = None
        if pushed is not None and pushed[1] == from_file:
            self.role, self.in_service = pushed[0].role, pushed[0].serving  # the file has not caught up yet
        else:
            self._pushed, self.role, self.in_service = None, from_file.role, from_file.serving
        if self.api_keys.reload():
            log.info("API keys reloaded: %d keys", len(self.api_keys))
        if self.watcher is None:
            return
        new = self.watcher.poll()
        if new is None:
            if self.watcher.last_error:
                log.warning("config not reloaded, keeping the last good one: %s", self.watcher.last_error)
                self.watcher.last_error = None
            return
        self.config = new
        self.engine.reconfigure(new.admission, new.model)
        self._note_sizing()
        self.metrics.configure(
            new.admission.tenancy.metrics_top_tenants,
            [t.name for t in new.admission.tenancy.tenants],
            [c.name for c in new.admission.priority_classes],
        )
        self._wake_settled()
        log.info("config reloaded from %s", self.watcher.path)

    async def _telemetry_loop(self) -> None:
        while True:
            interval = self.engine.admission.telemetry.poll_interval_ms / 1000.0
            try:
                reading = await self._read_backend()
                if self.nvml is not None and self.nvml.available:
                    self.gpu = await asyncio.to_thread(self.nvml.read)
                    if self.gpu is not None:
                        reading = dataclasses.replace(reading, gpu_memory_usage=self.gpu.memory_usage)
                self.engine.observe_telemetry(reading)
                self._note_sizing()
                self._wake_settled()
                self._check_config_against(reading.capacity or self.engine.backend_capacity)
            except Exception:  # e.g. an NVML error: the reading ages and the stale policy applies
                log.exception("telemetry poll failed")
            await asyncio.sleep(interval)

    def _check_config_against(self, capacity: BackendCapacity | None) -> None:
        """Log once (WARNING) each way the config promises more than the server reports it holds;
        :attr:`config_warnings` (in ``/tidegate/stats``) lists those in force."""
        engine = self.engine
        found = [] if capacity is None else telemetry.config_mismatches(engine.model, engine.configured, capacity)
        for warning in found:
            if warning not in self.config_warnings:
                log.warning("config does not match the model server: %s", warning)
        self.config_warnings = found

    async def _read_backend(self) -> Telemetry:
        """The backend's health, then, while it is healthy, its load signals and capacity (paths
        and engine from the config in force; problems are logged, counted and shown by the poller)."""
        server = self.config.server
        self.poller.configure(self.engine.model.engine, server.metrics_path, server.health_path)
        healthy = await self.poller.healthy()
        if healthy != self.backend_healthy:
            log.info("backend %s (GET %s)", "healthy again" if healthy else "unhealthy: not ready", server.health_path)
            self.backend_healthy = healthy
            if healthy:  # back from a restart, perhaps with other flags: its capacity is read again now
                self.poller.refresh_capacity()
        if not healthy:  # loading (llama.cpp: 503) or down: its metrics would only repeat that
            return Telemetry()
        self.engine.note_backend_healthy()  # the bounded wait for an unset budget's capacity starts
        return await self.poller.read(served_any=self.engine.counters.completed_total > 0)


async def serve(settings: SidecarSettings) -> int:
    """Run a sidecar until SIGTERM/SIGINT, then drain within the grace period. Returns the exit code."""
    watcher = ConfigWatcher(settings.config_path)
    sidecar = Sidecar(settings, watcher.config, nvml=telemetry.Nvml(), watcher=watcher)
    url = await sidecar.start()
    log.info(
        "tidegate admission on %s -> %s (pool %r, role %s)", url, settings.upstream, watcher.config.pool, sidecar.role
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    grace = (
        settings.drain_grace_s
        if settings.drain_grace_s is not None
        else float(sidecar.engine.admission.request_timeout_seconds)
    )
    log.info("signal received: draining %d in flight (grace %g s)", sidecar.engine.in_flight_requests, grace)
    clean = await sidecar.drain_and_wait(grace)
    await sidecar.stop()
    return 0 if clean else 1
