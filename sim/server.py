"""The sim-backend HTTP server: a vLLM-like OpenAI-compatible endpoint driven by the replica model.

One background task (the *driver*) runs the :class:`~tidegate.sim.replica.ReplicaModel` in
real time: it advances the model to the clock's model time, hands each event to the request
that owns the sequence, and sleeps until the end of the engine step in progress (or until a
request arrives, ends, or a fault switch changes). Handlers only parse, submit, relay and clean
up; so token gaps on the wire are the modelled step times (divided by ``time_scale``).

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (stream and not),
``GET /v1/models``, ``POST /tokenize``, ``GET /health`` (200 while the process serves, even
when stalled), ``GET /metrics`` (:mod:`tidegate.sim.metrics`; gzipped when the request accepts
gzip, as vLLM's), ``GET|POST /sim/faults``
(:mod:`tidegate.sim.faults`), ``GET /sim/state`` (the model's counters, for tests and demos).

Lifecycle guarantees: every sequence a request submitted is aborted (KV released) when the
request ends for any reason — completion, client disconnect mid-stream or while waiting (the
runner cancels handlers on disconnect, as vLLM aborts on ``is_disconnected``), server shutdown.
"""

import asyncio
import dataclasses
import gzip
import json
import logging
import random
import socket
import time
import uuid
from collections.abc import Callable, Hashable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import gzip_accepted

from tidegate.sim import faults as faults_mod
from tidegate.sim import protocol, tokenizer
from tidegate.sim.clock import ScaledClock
from tidegate.sim.metrics import VllmMetrics
from tidegate.sim.replica import Event, EventKind, PromptTooLong, ReplicaConfig, ReplicaModel

log = logging.getLogger(__name__)

_SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


@dataclasses.dataclass(frozen=True)
class SimSettings:
    """Everything one sim-backend needs. ``default_max_tokens``: tokens emitted when a request sets no cap."""

    model_name: str = "sim-llama-3.1-8b"
    replica: ReplicaConfig = dataclasses.field(default_factory=ReplicaConfig)
    time_scale: float = 1.0
    default_max_tokens: int = 256
    faults: faults_mod.Faults = dataclasses.field(default_factory=faults_mod.Faults)
    seed: int | None = None


@dataclasses.dataclass
class _Listener:
    queue: asyncio.Queue
    choice: int
    arrival_wall: float
    prompt_tokens: int
    last_token_wall: float = 0.0


class SimBackend:
    """One simulated model server. Use ``async with SimBackend(settings) as sim: sim.url`` or :meth:`app`."""

    def __init__(self, settings: SimSettings | None = None, wall: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings or SimSettings()
        self._wall = wall
        self.model = ReplicaModel(self.settings.replica)
        self.clock = ScaledClock(wall, self.settings.time_scale)
        self.metrics = VllmMetrics(self.settings.model_name, self.settings.replica.kv_capacity_tokens, self._gauges)
        self.faults = faults_mod.Faults()
        self._rng = random.Random(self.settings.seed)
        self._listeners: dict[Hashable, _Listener] = {}
        self._wake = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.set_faults(self.settings.faults)

    # -- the driver ------------------------------------------------------------------------
    def _gauges(self) -> dict[str, float]:
        m = self.model
        return {
            "num_requests_running": m.reported_running,
            "num_requests_waiting": m.reported_waiting,
            "kv_cache_usage_perc": m.kv_usage,
        }

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            self._dispatch(self.model.advance(self.clock.now()))
            nxt = self.model.next_event_s
            delay = None if nxt is None else self.clock.wall_delay(nxt)
            timer = None if delay is None else loop.call_later(delay, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                if timer is not None:
                    timer.cancel()

    def _dispatch(self, events: list[Event]) -> None:
        now = self._wall()
        for ev in events:
            if ev.kind is EventKind.PREEMPTED:
                self.metrics.preemptions.inc()
            listener = self._listeners.get(ev.seq_id)
            if listener is None:
                continue
            if ev.kind is EventKind.TOKEN:
                self.metrics.generation_tokens.inc()
                if ev.index == 0:
                    self.metrics.prompt_tokens.inc(listener.prompt_tokens)
                    self.metrics.ttft.observe(now - listener.arrival_wall)
                else:
                    self.metrics.itl.observe(now - listener.last_token_wall)
                listener.last_token_wall = now
            elif ev.kind is EventKind.SCHEDULED:
                self.metrics.queue_time.observe(now - listener.arrival_wall)
            elif ev.kind is EventKind.FINISHED:
                self.metrics.e2e.observe(now - listener.arrival_wall)
            listener.queue.put_nowait((listener.choice, ev))

    def set_faults(self, new: faults_mod.Faults) -> None:
        """Put fault switches in force now (pace of the model clock, frozen gauges)."""
        old, self.faults = self.faults, new
        self.clock.set_pace(slowdown=new.slowdown, stalled=new.stall)
        if new.freeze_metrics != old.freeze_metrics:
            self.metrics.freeze(new.freeze_metrics)
        self._wake.set()

    # -- completions -----------------------------------------------------------------------
    def _fault_response(self) -> web.Response | None:
        f = self.faults
        if f.reject_rate and self._rng.random() < f.reject_rate:
            body = protocol.error_body("sim-backend: rejected by the reject_rate fault", "RateLimitError", 429)
            return web.json_response(body, status=429, headers={"Retry-After": "1"})
        if f.error_rate and self._rng.random() < f.error_rate:
            body = protocol.error_body("sim-backend: failed by the error_rate fault", "InternalServerError", 500)
            return web.json_response(body, status=500)
        return None

    async def _generate(self, request: web.Request, kind: protocol.Kind) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response(
                protocol.error_body("the body is not valid JSON", "BadRequestError", 400), status=400
            )
        try:
            req = protocol.parse(kind, body, self.settings.model_name)
        except protocol.ApiError as exc:
            return web.json_response(exc.body(), status=exc.status)
        fault = self._fault_response()
        if fault is not None:
            return fault
        output_tokens, finish = req.plan(self.settings.replica.max_model_len, self.settings.default_max_tokens)
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        ids = [f"{rid}/{i}" for i in range(req.n)]
        queue: asyncio.Queue = asyncio.Queue()
        arrival, now_s = self._wall(), self.clock.now()
        try:
            for i, sid in enumerate(ids):
                self.model.submit(sid, req.prompt_tokens, output_tokens, now_s)
                self._listeners[sid] = _Listener(queue, i, arrival, req.prompt_tokens)
        except PromptTooLong as exc:
            return web.json_response(protocol.BadRequest(str(exc)).body(), status=400)
        self._wake.set()
        try:
            if req.stream:
                return await self._stream(request, req, rid, queue, output_tokens, finish)
            return await self._collect(req, rid, queue, finish)
        finally:
            now_s = self.clock.now()
            for sid in ids:
                self.model.abort(sid, now_s)
                self.model.release(sid)
                self._listeners.pop(sid, None)
            self._wake.set()

    async def _stream(self, request, req, rid, queue, output_tokens, finish) -> web.StreamResponse:
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        created, opened, done, emitted = int(time.time()), set(), 0, 0
        while done < req.n:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            out = []
            for choice, ev in batch:
                if ev.kind is EventKind.FINISHED:
                    done += 1
                    self.metrics.request_succeeded(finish)
                elif ev.kind is EventKind.TOKEN:
                    if req.kind == "chat" and choice not in opened:
                        opened.add(choice)
                        out.append(protocol.chunk(req, rid, created, choice, None, None))
                    last = ev.index + 1 == output_tokens
                    text = tokenizer.output_text(ev.index)
                    out.append(protocol.chunk(req, rid, created, choice, text, finish if last else None))
                    emitted += 1
            if out:
                await resp.write(b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in out))
        tail = b""
        if req.include_usage:
            tail = b"data: " + json.dumps(protocol.usage_chunk(req, rid, created, emitted)).encode() + b"\n\n"
        await resp.write(tail + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _collect(self, req, rid, queue, finish) -> web.Response:
        tokens = [0] * req.n
        done = 0
        while done < req.n:
            choice, ev = await queue.get()
            if ev.kind is EventKind.TOKEN:
                tokens[choice] += 1
            elif ev.kind is EventKind.FINISHED:
                done += 1
                self.metrics.request_succeeded(finish)
        return web.json_response(protocol.response(req, rid, int(time.time()), [(t, finish) for t in tokens]))

    # -- other routes ----------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise tokenizer.PromptError("the body must be a JSON object with prompt or messages")
            if "messages" in body:
                tokens = tokenizer.tokenize(tokenizer.render_chat(body["messages"]))
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                    tokens = list(prompt)
                else:
                    tokens = tokenizer.tokenize(prompt if isinstance(prompt, str) else _one_string(prompt))
        except (json.JSONDecodeError, UnicodeDecodeError, tokenizer.PromptError) as exc:
            return web.json_response(protocol.BadRequest(str(exc)).body(), status=400)
        max_len = self.settings.replica.max_model_len
        return web.json_response({"count": len(tokens), "max_model_len": max_len, "tokens": tokens})

    async def _models(self, _: web.Request) -> web.Response:
        name = self.settings.model_name
        card = {"id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm", "root": name}
        card.update(parent=None, max_model_len=self.settings.replica.max_model_len, permission=[])
        return web.json_response({"object": "list", "data": [card]})

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        """As vLLM serves it: prometheus_client's ASGI app (``make_asgi_app``) gzips the page whenever
        the request accepts gzip (``exposition.gzip_accepted``), which aiohttp's client does by default."""
        body, headers = self.metrics.render(), {"Content-Type": CONTENT_TYPE_LATEST}
        if gzip_accepted(request.headers.get("Accept-Encoding", "")):
            body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
        return web.Response(body=body, headers=headers)

    async def _get_faults(self, _: web.Request) -> web.Response:
        return web.json_response(self.faults.to_json())

    async def _post_faults(self, request: web.Request) -> web.Response:
        try:
            self.set_faults(faults_mod.apply(self.faults, await request.json()))
        except (json.JSONDecodeError, UnicodeDecodeError, faults_mod.FaultError) as exc:
            return web.json_response(protocol.BadRequest(str(exc)).body(), status=400)
        return web.json_response(self.faults.to_json())

    async def _state(self, _: web.Request) -> web.Response:
        m = self.model
        return web.json_response(
            {
                "model_time_s": self.clock.now(),
                **self._gauges(),
                "kv_used_tokens": m.kv_used_tokens,
                "kv_capacity_tokens": m.config.kv_capacity_tokens,
                "preemptions_total": m.preemptions_total,
                "prompt_tokens_total": m.prompt_tokens_total,
                "generation_tokens_total": m.generation_tokens_total,
                "finished_total": m.finished_total,
                "aborted_total": m.aborted_total,
                "faults": self.faults.to_json(),
            }
        )

    # -- lifecycle -------------------------------------------------------------------------
    async def _driver_ctx(self, _: web.Application):
        task = asyncio.create_task(self._drive(), name="sim-backend-driver")
        task.add_done_callback(_report_crash)
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def app(self) -> web.Application:
        """The aiohttp application (its cleanup context runs the driver). Serve it with
        ``handler_cancellation=True`` so that client disconnects abort sequences."""
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.cleanup_ctx.append(self._driver_ctx)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/sim/faults", self._get_faults)
        app.router.add_post("/sim/faults", self._post_faults)
        app.router.add_get("/sim/state", self._state)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0: a free port); returns and stores the base URL."""
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        sock = socket.create_server((host, port), backlog=1024)
        await web.SockSite(self._runner, sock, backlog=1024).start()
        bound = sock.getsockname()
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{bound[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> "SimBackend":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _report_crash(task: asyncio.Task) -> None:
    # A dead driver would hang every request silently; say so loudly instead.
    if not task.cancelled() and task.exception() is not None:
        log.error("sim-backend driver crashed; no more tokens will be emitted", exc_info=task.exception())


def _one_string(prompt: object) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    raise tokenizer.PromptError("tokenize: give prompt (a string or token ids) or messages")
