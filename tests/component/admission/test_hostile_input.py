"""Hostile input found by trying to break the sidecar: each must cost the client a 4xx at most,
never the sidecar its metrics, a tenant slot, or a 500."""

import asyncio
import email.utils
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from .helpers import MODEL, chat, error_of


async def _raw_request(port: int, head: bytes, body: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    await writer.drain()
    reply = await reader.read()
    writer.close()
    await writer.wait_closed()
    return reply


def _port(sidecar) -> int:
    return int(sidecar.url.rsplit(":", 1)[1])


async def test_invalid_utf8_tenant_header_neither_fails_the_request_nor_breaks_metrics(
    start_sim, start_sidecar, http
) -> None:
    sim = await start_sim(decode_tokens_per_s=1000)
    sidecar = await start_sidecar(sim.url, admission={"tenancy": {"identity": "header"}})
    body = json.dumps(chat(max_tokens=2)).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-tenant-id: bad\xe9\xff\r\n"
    reply = await _raw_request(_port(sidecar), head, body)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    async with http.get(f"{sidecar.url}/metrics") as resp:
        assert resp.status == 200
        assert "bad\ufffd\ufffd" in await resp.text()


async def _header_tenancy_sidecar(start_sim, start_sidecar) -> tuple[Any, Callable[[bytes], Awaitable[bytes]]]:
    """A sidecar with tenants from ``x-tenant-id``, and a function sending a chat request with extra raw header lines."""
    sim = await start_sim(decode_tokens_per_s=1000)
    sidecar = await start_sidecar(sim.url, admission={"tenancy": {"identity": "header"}})
    body = json.dumps(chat(max_tokens=2)).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"

    async def send(header_lines: bytes) -> bytes:
        return await _raw_request(_port(sidecar), head + header_lines, body)

    return sidecar, send


async def test_a_tenant_header_sent_twice_with_different_values_is_refused_not_guessed(
    start_sim, start_sidecar
) -> None:
    # A gateway that appends its tenant header (Envoy's default append action) behind a client
    # that sent its own would otherwise hand the client's choice of tenant to admission.
    sidecar, send = await _header_tenancy_sidecar(start_sim, start_sidecar)
    spoofed = await send(b"x-tenant-id: victim\r\nx-tenant-id: gateway-says\r\n")
    assert spoofed.startswith(b"HTTP/1.1 400"), spoofed[:200]
    err = error_of(json.loads(spoofed.split(b"\r\n\r\n", 1)[1]))
    assert err["param"] == "x-tenant-id" and "more than once" in err["message"]
    repeated = await send(b"x-tenant-id: acme\r\nx-tenant-id: acme\r\n")
    assert repeated.startswith(b"HTTP/1.1 200"), repeated[:200]  # the same value twice is not ambiguous
    merged = await send(b"x-tenant-id: victim, gateway-says\r\n")
    assert merged.startswith(b"HTTP/1.1 400"), merged[:200]  # the same two, merged into one by a proxy
    assert error_of(json.loads(merged.split(b"\r\n\r\n", 1)[1]))["param"] == "x-tenant-id"
    stats = sidecar.snapshot()
    assert "victim" not in stats.tenants and stats.tenants["acme"].admitted == 1
    assert not any("," in name for name in stats.tenants)
    assert (stats.in_flight_requests, stats.in_flight_tokens) == (0, 0)


async def test_a_merged_tenant_list_is_refused_even_when_its_first_value_is_over_the_length_cap(
    start_sim, start_sidecar
) -> None:
    # Tenant names may be 128 characters (the API's limit) and longer header values are cut to
    # 128; a client value of 128 characters or more, merged with the gateway's, must not lose the
    # gateway's part (the comma) to the cut and be admitted as the client's own choice.
    sidecar, send = await _header_tenancy_sidecar(start_sim, start_sidecar)
    merged = await send(b"x-tenant-id: " + b"v" * 128 + b", gateway-says\r\n")
    assert merged.startswith(b"HTTP/1.1 400"), merged[:200]
    assert error_of(json.loads(merged.split(b"\r\n\r\n", 1)[1]))["param"] == "x-tenant-id"
    assert sidecar.snapshot().admitted_total == 0


async def test_deeply_nested_json_is_a_400_in_the_openai_shape(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url)
    for depth in (900, 5000):
        content = "[" * depth + "]" * depth
        raw = f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": {content}}}]}}'
        async with http.post(
            f"{sidecar.url}/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == 400, await resp.text()
            assert "nested too deeply" in error_of(await resp.json())["message"]
    stats = sidecar.snapshot()
    assert (stats.in_flight_requests, stats.in_flight_tokens) == (0, 0)


@pytest.mark.parametrize("absurd", [10**400, 10**40])
async def test_absurd_backend_usage_cannot_leak_a_tenant_slot(start_sidecar, absurd: int) -> None:
    """An upstream reporting absurd usage: the tenant's concurrency slot comes back every time."""

    async def completions(_request: web.Request) -> web.Response:
        return web.json_response(
            {"id": "x", "object": "chat.completion", "model": MODEL, "choices": [],
             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": absurd}}
        )  # fmt: skip

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    upstream = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        sidecar = await start_sidecar(
            upstream,
            admission={"tenancy": {"identity": "header", "default": {"maxConcurrency": 1, "tokensPerSecond": 1000}}},
        )
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(
                    f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=4), headers={"x-tenant-id": "a"}
                ) as resp:
                    assert resp.status in (200, 429), await resp.text()
                    if resp.status == 429:
                        retry = int(resp.headers["Retry-After"])
                        assert 1 <= retry <= 3600, retry  # an honest wait, not 10**16 seconds
                        assert error_of(await resp.json())["code"] != "tenant_concurrency"
        stats = sidecar.snapshot()
        assert (stats.in_flight_requests, stats.in_flight_tokens) == (0, 0)
    finally:
        await runner.cleanup()


async def test_only_the_preStop_hook_or_loopback_may_drain_a_replica(start_sim, start_sidecar, tmp_path) -> None:
    """Clients of the Service reach this port: one GET must not take a replica out for good."""
    from unittest import mock

    from aiohttp.test_utils import make_mocked_request

    from tidegate.admission.sidecar import DRAIN_TOKEN_HEADER

    sim = await start_sim()
    config = tmp_path / "config.yaml"
    config.write_text(f"pool: p\nmodel: {{name: {MODEL}}}\ndrainToken: {'s' * 32}\n")
    sidecar = await start_sidecar(sim.url, config_path=str(config))

    def from_pod_network(headers: dict[str, str]):
        transport = mock.Mock()
        transport.get_extra_info.side_effect = lambda key, default=None: (
            ("10.244.1.7", 40000) if key == "peername" else default
        )
        return make_mocked_request("GET", "/tidegate/drain", headers=headers, transport=transport)

    refused = await sidecar._drain(from_pod_network({}))
    assert refused.status == 403 and not sidecar.draining
    refused = await sidecar._drain(from_pod_network({DRAIN_TOKEN_HEADER: "guess" * 8}))
    assert refused.status == 403 and not sidecar.draining
    accepted = await sidecar._drain(from_pod_network({DRAIN_TOKEN_HEADER: "s" * 32}))
    assert accepted.status == 200 and sidecar.draining


async def test_a_pushed_role_serves_at_once_and_holds_until_the_labels_file_changes(
    start_sim, start_sidecar, http, tmp_path
) -> None:
    """The kubelet rewrites the labels file only on its sync; the operator's push cannot wait for it."""
    from .helpers import eventually

    sim = await start_sim(decode_tokens_per_s=1000)
    labels = tmp_path / "labels"
    labels.write_text('tidegate.dev/pool="p"\ntidegate.dev/role="warm"\n')
    sidecar = await start_sidecar(sim.url, labels_file=str(labels), reload_s=0.05)
    async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 503  # warm: not serving
    async with http.put(f"{sidecar.url}/tidegate/role", json={"role": "active"}) as resp:
        assert resp.status == 200
    async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 200
    await asyncio.sleep(0.2)  # several reloads of the unchanged (stale) file: the push holds
    assert sidecar.role == "active"
    labels.write_text('tidegate.dev/pool="p"\ntidegate.dev/role="draining"\n')  # the kubelet caught up, later
    await eventually(lambda: sidecar.role == "draining", what="the labels file to win once it changes")
    async with http.put(f"{sidecar.url}/tidegate/role", json={"role": "boss"}) as resp:
        assert resp.status == 400


@pytest.mark.parametrize(
    "path", ["/v1/./chat/completions", "/v1/chat/../chat/completions", "/v1/%2e/completions", "//v1/chat/completions"]
)
async def test_dot_segment_paths_cannot_slip_past_admission(start_sim, start_sidecar, path: str) -> None:
    sim = await start_sim(decode_tokens_per_s=1000)
    sidecar = await start_sidecar(sim.url)
    body = json.dumps(chat(max_tokens=2)).encode()
    reply = await _raw_request(
        _port(sidecar), f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode(), body
    )
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert b'"bad_request"' in reply
    assert sidecar.snapshot().admitted_total == 0


async def test_ordinary_other_paths_still_pass_through(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url)
    async with http.get(f"{sidecar.url}/v1/models") as resp:
        assert resp.status == 200 and (await resp.json())["data"][0]["id"] == MODEL


async def _fake_upstream(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.mark.parametrize("upstream_retry", [None, "0", "Wed, 21 Oct 2026 07:28:00 GMT"])
async def test_upstream_429_reaches_the_client_with_an_honest_retry_after(start_sidecar, http, upstream_retry) -> None:
    async def busy(_request: web.Request) -> web.Response:
        headers = {"Retry-After": upstream_retry} if upstream_retry is not None else {}
        return web.json_response({"error": {"message": "busy"}}, status=429, headers=headers)

    runner, url = await _fake_upstream(busy)
    try:
        sidecar = await start_sidecar(url)
        async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=2)) as resp:
            assert resp.status == 429
            assert int(resp.headers["Retry-After"]) >= 1 and int(resp.headers["retry-after-ms"]) >= 1000
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("upstream_retry", "low", "high"),
    [("inf", 1, 3600), ("1e308", 1, 3600), ("nan", 1, 1), ("-5", 1, 1), ("in 120 s", 100, 121)],
)
async def test_an_upstream_retry_after_that_is_absurd_or_a_date_is_relayed_sanely(
    start_sidecar, http, upstream_retry, low, high
) -> None:
    if upstream_retry == "in 120 s":  # RFC 9110 allows an HTTP date
        upstream_retry = email.utils.formatdate(time.time() + 120, usegmt=True)

    async def busy(_request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "busy"}}, status=429, headers={"Retry-After": upstream_retry})

    runner, url = await _fake_upstream(busy)
    try:
        sidecar = await start_sidecar(url)
        async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=2)) as resp:
            assert resp.status == 429, await resp.text()
            seconds = int(resp.headers["Retry-After"])
            assert low <= seconds <= high
            assert int(resp.headers["retry-after-ms"]) == 1000 * seconds
        assert sidecar.snapshot().in_flight_requests == 0
    finally:
        await runner.cleanup()


async def test_a_stream_the_upstream_breaks_ends_with_an_error_event_not_silence(start_sidecar, http) -> None:
    async def breaks(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(3):
            await resp.write(f'data: {{"choices": [{{"index": 0, "delta": {{"content": "t{i}"}}}}]}}\n\n'.encode())
        request.transport.close()  # the model server dies mid-stream
        return resp

    runner, url = await _fake_upstream(breaks)
    try:
        sidecar = await start_sidecar(url)
        async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=20, stream=True)) as resp:
            text = (await resp.read()).decode()
        last = [line for line in text.splitlines() if line.startswith("data: ")][-1]
        assert json.loads(last[len("data: ") :])["error"]["code"] == "upstream_error", text
        stats = sidecar.snapshot()
        assert (stats.in_flight_requests, stats.in_flight_tokens) == (0, 0)
    finally:
        await runner.cleanup()
