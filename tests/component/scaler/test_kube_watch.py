"""KubernetesPodSource against a stand-in API server over loopback: list, then watch events.

The stand-in serves ``GET /api/v1/namespaces/NS/pods`` (a PodList; with ``watch=true`` a stream
of watch events fed by the test) to the real ``kubernetes`` client. A real API server is the
cluster tier's job; this checks the list/watch/relist logic and the label selector.
"""

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client

from tidegate.scaler.errors import PodSourceError
from tidegate.scaler.kube import KubernetesPodSource


def pod(name: str, role: str = "active", ready: bool = True, ip: str = "10.0.0.1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1",
                     "labels": {"tidegate.dev/pool": "small", "tidegate.dev/role": role}},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }  # fmt: skip


class FakeApi:
    def __init__(self) -> None:
        self.pods = [pod("small-0"), pod("small-1", role="warm")]
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.selectors: list[str] = []
        self.fail = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.selectors.append(request.query.get("labelSelector", ""))
        if self.fail:
            return web.json_response({"kind": "Status", "code": 503, "message": "down"}, status=503)
        if request.query.get("watch") not in ("true", "True", "1"):
            items = list(self.pods)
            return web.json_response(
                {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}
            )
        resp = web.StreamResponse()
        await resp.prepare(request)
        deadline = time.monotonic() + float(request.query.get("timeoutSeconds", "5"))
        while time.monotonic() < deadline:
            try:
                event = await asyncio.wait_for(self.events.get(), 0.1)
            except TimeoutError:
                continue
            await resp.write(json.dumps(event).encode() + b"\n")
        return resp


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApi, client.CoreV1Api]]:
    fake = FakeApi()
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/pods", fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{runner.addresses[0][1]}"
    api_client = client.ApiClient(cfg)
    try:
        yield fake, client.CoreV1Api(api_client)
    finally:
        await asyncio.to_thread(api_client.close)
        await runner.cleanup()


async def _eventually(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_lists_then_follows_the_watch(api) -> None:
    fake, core = api
    source = KubernetesPodSource(api=core, watch_timeout_s=2)
    try:
        pods = await source.pods("ns", "small")
        assert [(p.name, p.role, p.ready, p.base_url(8081)) for p in pods] == [
            ("small-0", "active", True, "http://10.0.0.1:8081"),
            ("small-1", "warm", True, "http://10.0.0.1:8081"),
        ]
        assert fake.selectors[0] == "tidegate.dev/pool=small"
        await fake.events.put({"type": "ADDED", "object": pod("small-2", ready=False, ip="10.0.0.3")})

        async def three() -> bool:
            return [p.name for p in await source.pods("ns", "small")] == ["small-0", "small-1", "small-2"]

        await _eventually(three)
        await fake.events.put({"type": "DELETED", "object": pod("small-0")})

        async def two() -> bool:
            return [p.name for p in await source.pods("ns", "small")] == ["small-1", "small-2"]

        await _eventually(two)
    finally:
        await source.close()


async def test_an_api_server_that_never_answered_is_a_pod_source_error(api) -> None:
    fake, core = api
    fake.fail = True
    source = KubernetesPodSource(api=core, first_list_timeout_s=5)
    try:
        with pytest.raises(PodSourceError, match="ns/small"):
            await source.pods("ns", "small")
    finally:
        await source.close()
