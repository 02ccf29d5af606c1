"""The admitted path's own upstream client: kept-alive connections, and answers framed every way."""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from .helpers import MODEL, chat, eventually

ANSWER = {
    "id": "x", "object": "chat.completion", "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}  # fmt: skip


@pytest.fixture
async def raw_upstream() -> AsyncIterator[Callable[[bytes], Awaitable[str]]]:
    """``await raw_upstream(answer_bytes)``: a server writing exactly those bytes per request, then closing."""
    servers: list[asyncio.Server] = []

    async def _start(answer: bytes) -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line[15:]) for line in head.split(b"\r\n") if line[:15].lower() == b"content-length:")
            await reader.readexactly(length)
            writer.write(answer)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield _start
    for server in servers:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("framing", ["content-length", "chunked", "until-close"])
async def test_an_answer_framed_any_way_arrives_whole_and_its_usage_is_charged(
    start_sidecar, http, raw_upstream, framing: str
) -> None:
    body = json.dumps(ANSWER).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Backend: raw\r\n"
    if framing == "content-length":
        answer = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    elif framing == "chunked":
        half = len(body) // 2
        answer = head + b"Transfer-Encoding: chunked\r\n\r\n"
        answer += b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:])
    else:
        answer = head + b"Connection: close\r\n\r\n" + body
    sidecar = await start_sidecar(await raw_upstream(answer), model={"engine": "openai"})
    for _ in range(2):  # the upstream closes every connection: the second request must not reuse it
        async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=4)) as resp:
            assert resp.status == 200
            assert resp.headers["X-Backend"] == "raw"
            assert await resp.json() == ANSWER
    assert sidecar.engine.counters.charged_tokens_total == 2 * 7  # the reported usage, not the reservation
    assert sidecar.engine.in_flight_requests == 0


async def test_connections_the_upstream_closed_while_idle_are_never_reused(start_sidecar, http) -> None:
    async def completions(_request: web.Request) -> web.Response:
        return web.json_response(ANSWER)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app, keepalive_timeout=0.05)  # the backend drops idle connections quickly
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        sidecar = await start_sidecar(f"http://127.0.0.1:{runner.addresses[0][1]}", model={"engine": "openai"})
        async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=4)) as resp:
            assert resp.status == 200
        pool = sidecar.forwarder.pool
        assert pool is not None and len(pool._idle) == 1  # kept alive for the next request
        await eventually(lambda: pool._idle[0].closed, what="the backend closing the idle connection")
        for _ in range(3):
            async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=4)) as resp:
                assert resp.status == 200, await resp.text()
    finally:
        await runner.cleanup()
