"""Robustness gaps from a break-it review (issue #3): each test is what a client or an operator
would notice when the model server or a client misbehaves."""

import asyncio
import json
import time

import pytest

from .helpers import error_of


def _port(sidecar) -> int:
    return int(sidecar.url.rsplit(":", 1)[1])


async def _read_reply(reader: asyncio.StreamReader, timeout_s: float) -> tuple[int, dict, bytes]:
    """(status, lower-cased headers, body) of one HTTP/1.1 reply, read until the server closes."""
    raw = await asyncio.wait_for(reader.read(), timeout_s)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    if headers.get("transfer-encoding") == "chunked":
        decoded, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            decoded, rest = decoded + rest[:size], rest[size + 2 :]
        body = decoded
    return int(lines[0].split()[1]), headers, body


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_client_that_stops_sending_its_body_gets_408_and_holds_nothing(
    start_sim, start_sidecar, framing: str
) -> None:
    """Slow-loris: headers, a few bytes of body, then silence (or a byte now and then)."""
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url, admission={"bodyReadTimeoutSeconds": 0.5})
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(sidecar))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    started = time.monotonic()
    if framing == "content-length":
        writer.write(head + b"Content-Length: 1000\r\n\r\n" + b'{"model": "m", ')
        await writer.drain()
        status, headers, body = await _read_reply(reader, timeout_s=5.0)
    else:  # a byte every 100 ms: never idle, never done
        writer.write(head + b"Transfer-Encoding: chunked\r\n\r\n")

        async def trickle() -> None:
            while True:
                writer.write(b"1\r\n \r\n")
                await writer.drain()
                await asyncio.sleep(0.1)

        trickler = asyncio.ensure_future(trickle())
        try:
            status, headers, body = await _read_reply(reader, timeout_s=5.0)
        finally:
            trickler.cancel()
    elapsed = time.monotonic() - started
    writer.close()
    assert status == 408
    assert 0.4 <= elapsed < 3.0
    assert headers.get("connection") == "close"
    err = error_of(json.loads(body))
    assert err["code"] == "body_read_timeout" and err["type"] == "invalid_request_error"
    engine = sidecar.engine
    assert engine.in_flight_requests == engine.in_flight_tokens == engine.queue.depth == 0
    assert all(s.accepted == 0 for s in engine.tenants.states.values())
    assert engine.counters.admitted_total == 0
    assert dict(engine.counters.rejected_total) == {"bad_request": 1}  # a policy refusal: never buys GPUs
    assert sim.model.num_running == 0
