"""Tenant identity through a real sidecar: unlisted and rotating names share the default quota
(``unlistedTenants: shared``), and ``requireIdentity`` refuses a request that names no tenant."""

import asyncio

import pytest

from .helpers import chat, error_of

URL = "/v1/chat/completions"
DEFAULT = {"maxConcurrency": 4, "tokensPerSecond": 2000}


async def _six_rotating_at_once(http, url: str) -> list[tuple[int, str | None]]:
    async def one(i: int) -> tuple[int, str | None]:
        headers = {"x-tenant-id": f"rotating-{i}"}
        async with http.post(url + URL, json=chat(max_tokens=40), headers=headers) as resp:
            body = await resp.json()
            return resp.status, None if resp.status == 200 else error_of(body)["code"]

    return await asyncio.gather(*(one(i) for i in range(6)))


async def test_rotating_tenant_names_cannot_escape_the_default_quota(start_sim, start_sidecar, http) -> None:
    sim = await start_sim(decode_tokens_per_s=20)  # 40 tokens: 2 s each, so all six overlap
    sidecar = await start_sidecar(sim.url, admission={"tenancy": {"identity": "header", "default": DEFAULT}})
    answers = await _six_rotating_at_once(http, sidecar.url)
    assert sorted(answers, key=str) == [(200, None)] * 4 + [(429, "tenant_concurrency")] * 2
    async with http.get(sidecar.url + "/metrics") as m:
        text = await m.text()
    assert 'reason="tenant_concurrency",tenant="rotating-' in text  # still labelled by the name sent


async def test_separate_unlisted_tenants_each_get_the_default_quota(start_sim, start_sidecar, http) -> None:
    sim = await start_sim(decode_tokens_per_s=20)
    tenancy = {"identity": "header", "default": DEFAULT, "unlistedTenants": "separate"}
    sidecar = await start_sidecar(sim.url, admission={"tenancy": tenancy})
    assert await _six_rotating_at_once(http, sidecar.url) == [(200, None)] * 6


@pytest.mark.parametrize("headers", [{}, {"x-team": ""}], ids=["missing", "empty"])
async def test_require_identity_refuses_a_request_without_the_header(start_sim, start_sidecar, http, headers) -> None:
    sim = await start_sim()
    tenancy = {"identity": "header", "header": "x-team", "requireIdentity": True}
    sidecar = await start_sidecar(sim.url, admission={"tenancy": tenancy})
    async with http.post(sidecar.url + URL, json=chat(max_tokens=2), headers=headers) as resp:
        assert resp.status == 400
        err = error_of(await resp.json())
    assert err["param"] == "x-team" and "x-team" in err["message"] and "required" in err["message"]
    assert sim.model.num_running == 0 and sidecar.engine.counters.admitted_total == 0
    async with http.post(sidecar.url + URL, json=chat(max_tokens=2), headers={"x-team": "search"}) as resp:
        assert resp.status == 200


async def test_without_require_identity_a_missing_header_is_the_default_tenant(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url, admission={"tenancy": {"identity": "header"}})
    async with http.post(sidecar.url + URL, json=chat(max_tokens=2)) as resp:
        assert resp.status == 200
    assert set(sidecar.engine.counters.tenants) == {"default"}
