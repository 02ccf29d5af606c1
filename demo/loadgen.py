"""The client side: sends the scenario's arrivals (open loop) to the pool's Service, like real users.

Each arrival is one streamed chat completion (``stream: true``) sent at its time whatever happened
to earlier ones, to the next endpoint of the Service in round-robin order (kube-proxy spreads
connections; endpoints are the pods the Service selects that passed their readiness probe: active
ones, and warm ones under ``warmPool.serve``). The tenant and
class travel in the headers the sidecar is configured to trust. The outcome is read from the
answer: 200 and the time to the first streamed token, or the OpenAI error body's ``code`` (the
admission reason). A ``not_active`` answer (the pod left the Service between the endpoint list
and the request) is retried once on another endpoint, as a client with a fresh endpoint list would.
No other retries: a refused request counts as refused.
"""

import asyncio
import contextlib
import itertools
import json
from collections.abc import Callable

import aiohttp

from tidegate.demo import scenario
from tidegate.demo.timeline import ADMITTED, ERROR, Outcome, Timeline, kind_of

_WORDS = "the quick brown fox jumps over a lazy dog while the model thinks about tokens and queues "


def _prompt(chars: int) -> str:
    return (_WORDS * (chars // len(_WORDS) + 1))[:chars]


PROMPTS = {cls: _prompt(shape.prompt_chars) for cls, shape in scenario.SHAPES.items()}


class LoadGenerator:
    """Sends ``arrivals`` at their times (seconds on ``clock``) to ``endpoints()``; records into ``timeline``."""

    def __init__(
        self,
        arrivals: list[scenario.Arrival],
        endpoints: Callable[[], list[str]],
        timeline: Timeline,
        clock: Callable[[], float],
        http: aiohttp.ClientSession,
        request_timeout_s: float = 60.0,
        role_of: Callable[[str], str] | None = None,
    ) -> None:
        self.arrivals = arrivals
        self.endpoints = endpoints
        self.role_of = role_of  # url -> the role of the pod there, recorded with each outcome
        self.timeline = timeline
        self.clock = clock
        self.http = http
        self.request_timeout_s = request_timeout_s
        self._rr = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        self._recorded: set[int] = set()  # ids of outcomes already in the timeline
        self.in_flight = 0

    async def run(self) -> None:
        """Send every arrival at its time; returns when the last one was sent (not answered)."""
        for arrival in self.arrivals:
            delay = arrival.t_s - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self._one(arrival))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for answers still streaming, then cancel the rest; returns how many were cancelled."""
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            return len(pending)
        return 0

    def _pick(self, avoid: str = "") -> str | None:
        urls = [u for u in self.endpoints() if u != avoid] or self.endpoints()
        if not urls:
            return None
        return urls[next(self._rr) % len(urls)]

    async def _one(self, arrival: scenario.Arrival) -> None:
        sent = self.clock()
        outcome = Outcome(sent, arrival.tenant, arrival.cls, ERROR, "no_endpoint")
        self.in_flight += 1
        try:
            url = self._pick()
            for _attempt in range(2):
                if url is None:
                    break
                if self.role_of is not None:
                    outcome.role = self.role_of(url)
                await self._send(url, arrival, outcome)
                if outcome.reason != "not_active":
                    break
                url = self._pick(avoid=url)
        finally:
            self.in_flight -= 1
            self._record(outcome)

    def _record(self, outcome: Outcome) -> None:
        if id(outcome) not in self._recorded:
            self._recorded.add(id(outcome))
            self.timeline.outcomes.append(outcome)

    async def _send(self, url: str, arrival: scenario.Arrival, outcome: Outcome) -> None:
        """One attempt; fills ``outcome`` (recorded in the timeline as soon as the status is known)."""
        shape = scenario.SHAPES[arrival.cls]
        body = {
            "model": scenario.MODEL,
            "messages": [{"role": "user", "content": PROMPTS[arrival.cls]}],
            "max_tokens": shape.max_tokens,
            "stream": True,
        }
        headers = {scenario.TENANT_HEADER: arrival.tenant, scenario.PRIORITY_HEADER: arrival.cls}
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        try:
            async with self.http.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=timeout) as r:
                if r.status != 200:
                    code = None
                    with contextlib.suppress(ValueError, aiohttp.ContentTypeError, AttributeError, TypeError, KeyError):
                        code = (await r.json())["error"]["code"]
                    outcome.kind, outcome.reason = kind_of(r.status, code), code or f"http_{r.status}"
                    if outcome.reason != "not_active":
                        self._record(outcome)
                    return
                outcome.kind, outcome.reason = ADMITTED, ""
                self._record(outcome)
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    if outcome.ttft_s is None and b'"content": "' in line and b'"content": ""' not in line:
                        outcome.ttft_s = self.clock() - outcome.t_s
                    elif b'"error"' in line:  # shed or failed mid-stream
                        outcome.kind, outcome.reason = ERROR, _sse_error(line)
        except (aiohttp.ClientError, TimeoutError) as exc:
            outcome.kind, outcome.reason = ERROR, type(exc).__name__
            self._record(outcome)


def _sse_error(line: bytes) -> str:
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return str(json.loads(line[len(b"data: ") :])["error"].get("code") or "stream_error")
    return "stream_error"
