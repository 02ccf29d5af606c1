"""The client side of the e2e scenarios: streamed chat completions, as an OpenAI SDK user sends them.

Requests go to the pool's Service endpoints (``endpoints()``: active, ready pods; see
:meth:`~tests.e2e.harness.podagent.PodAgent.endpoints`) in round-robin order, open loop (sent at
their time whatever happened to earlier ones). The tenant and priority travel in the headers the
e2e pools trust (names shared with :mod:`tidegate.demo.scenario`). A ``not_active`` answer (the pod
left the Service between the endpoint list and the request) is retried once elsewhere, as a
client with a fresh endpoint list would; nothing else is retried.
"""

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable

import aiohttp

from tidegate.admission.reasons import CAPACITY_REASONS, POLICY_REASONS
from tidegate.demo import scenario

PROMPT = ("the quick brown fox jumps over a lazy dog while the model thinks about tokens " * 4)[:240]


@dataclasses.dataclass
class Result:
    """One request: ``t_s`` when sent (monotonic), the HTTP status, the admission reason (error
    body ``code``), ``Retry-After`` as sent, tokens streamed, whether the stream ended with [DONE]."""

    t_s: float
    tenant: str
    url: str = ""
    status: int = 0
    reason: str = ""
    retry_after: str | None = None
    tokens: int = 0
    done: bool = False
    ended_s: float | None = None

    @property
    def capacity_rejected(self) -> bool:
        return self.status != 200 and self.reason in CAPACITY_REASONS

    @property
    def policy_rejected(self) -> bool:
        return self.status != 200 and self.reason in POLICY_REASONS


class Client:
    """Sends requests to ``endpoints()``; every :class:`Result` lands in :attr:`results`."""

    def __init__(self, endpoints: Callable[[], list[str]], http: aiohttp.ClientSession) -> None:
        self.endpoints = endpoints
        self.http = http
        self.results: list[Result] = []
        self._rr = itertools.count()
        self._tasks: set[asyncio.Task] = set()

    def _pick(self, avoid: str = "") -> str | None:
        urls = [u for u in self.endpoints() if u != avoid] or self.endpoints()
        return urls[next(self._rr) % len(urls)] if urls else None

    async def send(self, tenant: str, max_tokens: int = 8, url: str | None = None, prompt: str = PROMPT) -> Result:
        """One streamed request (to ``url``, or the next endpoint); returns when the answer ended."""
        result = Result(time.monotonic(), tenant)
        self.results.append(result)
        target = url or self._pick()
        for _attempt in range(2):
            if target is None:
                result.reason = "no_endpoint"
                break
            await self._attempt(target, tenant, max_tokens, result, prompt)
            if result.reason != "not_active" or url is not None:
                break
            target = self._pick(avoid=target)
        result.ended_s = time.monotonic()
        return result

    async def _attempt(self, url: str, tenant: str, max_tokens: int, result: Result, prompt: str) -> None:
        body = {
            "model": scenario.MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": True,
        }
        headers = {scenario.TENANT_HEADER: tenant, scenario.PRIORITY_HEADER: scenario.INTERACTIVE}
        result.url, result.reason = url, ""
        try:
            async with self.http.post(
                url + "/v1/chat/completions", json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=120)
            ) as resp:
                result.status = resp.status
                result.retry_after = resp.headers.get("Retry-After")
                if resp.status != 200:
                    with contextlib.suppress(ValueError, aiohttp.ContentTypeError, KeyError, TypeError):
                        result.reason = (await resp.json())["error"]["code"]
                    result.reason = result.reason or f"http_{resp.status}"
                    return
                async for line in resp.content:
                    if line.startswith(b"data: [DONE]"):
                        result.done = True
                    elif line.startswith(b"data: {") and b'"content": "' in line and b'"content": ""' not in line:
                        result.tokens += 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            result.reason = type(exc).__name__

    def start(self, tenant: str, max_tokens: int = 8, url: str | None = None, prompt: str = PROMPT) -> asyncio.Task:
        task = asyncio.create_task(self.send(tenant, max_tokens, url, prompt))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def rate(self, rates_rps: dict[str, float], duration_s: float, max_tokens: int = 8) -> None:
        """Send at ``rates_rps`` per tenant, evenly spaced, for ``duration_s`` (does not wait for answers)."""
        start = time.monotonic()
        schedule = sorted(
            (i / rps, tenant) for tenant, rps in rates_rps.items() if rps > 0 for i in range(int(duration_s * rps))
        )
        for offset, tenant in schedule:
            delay = start + offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self.start(tenant, max_tokens)

    async def drain(self, timeout_s: float = 60.0) -> None:
        """Wait for every request still in flight (cancelled after ``timeout_s``)."""
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
            for task in pending:
                task.cancel()


def window(results: list[Result], start_s: float, end_s: float, tenant: str | None = None) -> list[Result]:
    """Results sent in ``[start_s, end_s)`` (monotonic), optionally of one tenant."""
    return [r for r in results if start_s <= r.t_s < end_s and (tenant is None or r.tenant == tenant)]


def capacity_reject_rate(results: list[Result]) -> float:
    """Capacity-rejected / all answered requests (the scaler's own notion: policy refusals are demand too)."""
    answered = [r for r in results if r.status]
    return sum(r.capacity_rejected for r in answered) / len(answered) if answered else 0.0
