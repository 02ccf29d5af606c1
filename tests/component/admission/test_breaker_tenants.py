"""A breaker no client can trip for the others, in front of an upstream that answers like llama.cpp.

llama-server (llama.cpp 0c1e570, vendored by llama-cpp-python 0.3.36) answers a malformed ``tools``
array with HTTP 500 ``server_error`` (``ex_wrapper`` in ``tools/server/server.cpp``); the fake below
answers ``"tools": [{}]`` with the very status and body that llama-server answered it with.
"""

import logging
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from .helpers import chat, error_of, fake_upstream

TOOLS_ERROR = {
    "error": {
        "code": 500,
        "message": "Failed to parse tools: Missing tool type: {}; tools = [\n  {}\n]",
        "type": "server_error",
    }
}
COMPUTE_ERROR = {"error": {"code": 500, "message": "Compute error.", "type": "server_error"}}
ANSWER = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "object": "chat.completion", "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
}  # fmt: skip


class LlamaCppLike:
    """The fake model server: ``broken`` makes every generation fail, as a degraded replica would."""

    def __init__(self) -> None:
        self.broken = False
        self.url = ""

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        tools = body.get("tools")
        if tools is not None and not all(isinstance(t, dict) and "function" in t for t in tools):
            return web.json_response(TOOLS_ERROR, status=500)
        if self.broken or body["messages"][0]["content"] == "crash me":
            return web.json_response(COMPUTE_ERROR, status=500)
        return web.json_response(ANSWER)


@pytest.fixture
async def llamacpp_like() -> AsyncIterator[LlamaCppLike]:
    fake = LlamaCppLike()
    async with fake_upstream({"/v1/chat/completions": fake.chat}) as fake.url:
        yield fake


TENANCY = {"tenancy": {"identity": "header"}, "circuitBreaker": {"minSamples": 4}}


async def _post(http, sidecar, tenant: str, body: dict) -> tuple[int, dict, dict]:
    headers = {"x-tenant-id": tenant}
    async with http.post(sidecar.url + "/v1/chat/completions", json=body, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.json()


async def test_one_tenants_malformed_tools_are_relayed_and_never_trip_the_breaker(
    llamacpp_like, start_sidecar, http
) -> None:
    sidecar = await start_sidecar(llamacpp_like.url, admission=TENANCY, model={"engine": "llamacpp"})
    for _ in range(10):  # no other tenant has been served yet: judged by the body alone
        status, _, body = await _post(http, sidecar, "careless", chat(max_tokens=4, tools=[{}]))
        assert status == 500 and body == TOOLS_ERROR  # the server's own answer, relayed
    status, _, body = await _post(http, sidecar, "careful", chat(max_tokens=4))
    assert status == 200 and body["choices"][0]["message"]["content"] == "hi"
    assert sidecar.engine.breaker_state.value == "closed"


async def test_one_tenants_server_errors_leave_the_other_tenants_served(llamacpp_like, start_sidecar, http) -> None:
    sidecar = await start_sidecar(llamacpp_like.url, admission=TENANCY, model={"engine": "llamacpp"})
    assert (await _post(http, sidecar, "careful", chat(max_tokens=4)))[0] == 200
    for _ in range(10):  # 500s the body does not excuse, but only this tenant's requests fail
        status, _, body = await _post(http, sidecar, "unlucky", chat("crash me", max_tokens=4))
        assert status == 500 and body == COMPUTE_ERROR
    for tenant in ("careful", "newcomer"):
        status, headers, _ = await _post(http, sidecar, tenant, chat(max_tokens=4))
        assert status == 200, headers


async def test_a_replica_failing_every_tenant_still_opens_the_breaker_and_says_so(
    llamacpp_like, start_sidecar, http, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="tidegate.admission.engine")
    sidecar = await start_sidecar(llamacpp_like.url, admission=TENANCY, model={"engine": "llamacpp"})
    for tenant in ("a", "b", "c"):
        assert (await _post(http, sidecar, tenant, chat(max_tokens=4)))[0] == 200
    llamacpp_like.broken = True
    statuses = []
    for i in range(12):
        status, headers, body = await _post(http, sidecar, "abc"[i % 3], chat(max_tokens=4))
        statuses.append(status)
        if status == 503:
            break
    assert statuses[-1] == 503 and set(statuses[:-1]) == {500}, statuses
    assert error_of(body)["code"] == "circuit_open" and headers["Retry-After"] == "60"
    trips = [r for r in caplog.records if "circuit breaker closed -> open" in r.getMessage()]
    assert len(trips) == 1 and trips[0].levelno == logging.INFO
    assert "upstream failures" in trips[0].getMessage() and "open for 60 s" in trips[0].getMessage()
