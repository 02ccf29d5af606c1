"""Request bodies, SSE reading, polling and fake upstreams for the sidecar component tests."""

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

MODEL = "sim-llama-3.1-8b"


def chat(content: str = "hello there", **extra: object) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


async def sse_events(resp: aiohttp.ClientResponse, limit: int | None = None) -> list[tuple[float, object]]:
    """(arrival time, parsed event) per ``data:`` event, up to ``limit`` events."""
    events: list[tuple[float, object]] = []
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append((time.monotonic(), payload if payload == "[DONE]" else json.loads(payload)))
            if limit is not None and len(events) >= limit:
                break
    return events


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    """Poll ``check`` every 10 ms until true; fail after ``timeout_s`` (never a bare sleep)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


def error_of(body: dict) -> dict:
    """The OpenAI error object, checking its shape."""
    assert set(body) == {"error"}, body
    err = body["error"]
    assert {"message", "type", "param", "code"} <= set(err), err
    assert isinstance(err["message"], str) and err["message"]
    return err


@contextlib.asynccontextmanager
async def fake_upstream(
    routes: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]],
) -> AsyncIterator[str]:
    """Serve ``{path: POST handler}`` on a free loopback port; yields the base URL."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
