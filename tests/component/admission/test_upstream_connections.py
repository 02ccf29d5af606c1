"""Upstream connections that the model server closes without saying so never fail a request.

llama-server (llama.cpp 0c1e570) closes the connection a little after a streamed answer without a
``Connection: close`` header, and uvicorn (vLLM) and cpp-httplib close idle connections after 5 s.
A request the sidecar sends on such a connection fails before the server reads it: a 502 for the
client and a failure for the breaker. The fake below closes each connection 0.2 s after a stream
ended, and takes 0.4 s to start answering, so a request on a reused connection is cut mid-way.
"""

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from .helpers import chat, fake_upstream

CLOSE_AFTER_STREAM_S = 0.2
FIRST_BYTE_S = 0.4


class ClosesAfterStreams:
    def __init__(self) -> None:
        self.url = ""
        self.connections: set[int] = set()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        transport = request.transport
        assert transport is not None
        self.connections.add(id(transport))
        await asyncio.sleep(FIRST_BYTE_S)
        if not body.get("stream"):
            return web.json_response(
                {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}
            )  # fmt: skip
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n')
        await response.write(
            b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
            b'"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}\n\n'
        )
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        asyncio.get_running_loop().call_later(CLOSE_AFTER_STREAM_S, transport.close)
        return response


@pytest.fixture
async def closes_after_streams() -> AsyncIterator[ClosesAfterStreams]:
    fake = ClosesAfterStreams()
    async with fake_upstream({"/v1/chat/completions": fake.chat}) as fake.url:
        yield fake


async def test_a_request_after_a_stream_never_meets_the_closed_connection(closes_after_streams, start_sidecar, http):
    sidecar = await start_sidecar(closes_after_streams.url)
    statuses = []
    for i in range(4):
        async with http.post(sidecar.url + "/v1/chat/completions", json=chat(f"hello {i}", stream=i % 2 == 0)) as r:
            await r.read()
            statuses.append(r.status)
    assert statuses == [200, 200, 200, 200]
    stats = sidecar.snapshot()
    assert stats.breaker_state.value == "closed" and not stats.rejected_total
