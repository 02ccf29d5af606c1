"""The model servers' own generation routes cannot bypass admission: aliases of the admitted paths
are admitted (and counted), other generation routes are refused before reaching the model server,
and ordinary paths still pass through."""

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from .helpers import MODEL, chat, error_of

_CHAT = {"id": "c", "object": "chat.completion", "model": MODEL,
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}  # fmt: skip
_COMPLETION = {"id": "t", "object": "text_completion", "model": MODEL,
               "choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}  # fmt: skip


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, list[tuple[str, str]]]]:
    """A model server that answers every path and records (method, path) of what reached it."""
    seen: list[tuple[str, str]] = []

    async def any_path(request: web.Request) -> web.Response:
        seen.append((request.method, request.path))
        if request.path == "/v1/chat/completions":
            return web.json_response(_CHAT)
        if request.path == "/v1/completions":
            return web.json_response(_COMPLETION)
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        return web.json_response({"ok": True, "path": request.path})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", any_path)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


def _generation(seen: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [s for s in seen if s[1] not in ("/health", "/metrics")]  # the sidecar's telemetry polls


def _decisions(text: str, decision: str, reason: str = "") -> float:
    total = 0.0
    for line in text.splitlines():
        labels = (f'decision="{decision}"', f'reason="{reason}"')
        if line.startswith("tidegate_admission_decisions_total{") and all(label in line for label in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize(
    ("path", "forwarded_to"),
    [
        ("/chat/completions", "/v1/chat/completions"),  # llama.cpp's alias
        ("/v1/chat/completions/", "/v1/chat/completions"),
        ("/V1/Chat/Completions", "/v1/chat/completions"),
        ("/v1/chat%2Fcompletions", "/v1/chat/completions"),
        ("/%761/completions", "/v1/completions"),
        ("/v1/completions/", "/v1/completions"),
    ],
)
async def test_aliases_and_spellings_of_the_admitted_paths_are_admitted_and_counted(
    start_sidecar, http, upstream, path: str, forwarded_to: str
) -> None:
    url, seen = upstream
    sidecar = await start_sidecar(url)
    body = chat(max_tokens=2) if "chat" in forwarded_to else {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    async with http.post(f"{sidecar.url}{path}", json=body) as resp:
        assert resp.status == 200, await resp.text()
    assert _generation(seen) == [("POST", forwarded_to)]
    assert sidecar.snapshot().admitted_total == 1
    async with http.get(f"{sidecar.url}/tidegate/stats") as resp:
        assert (await resp.json())["admitted_total"] == 1
    async with http.get(f"{sidecar.url}/metrics") as resp:
        assert _decisions(await resp.text(), "admit") == 1


@pytest.mark.parametrize(
    "path",
    [
        # vLLM
        "/v1/responses", "/v1/messages", "/invocations", "/inference/v1/generate", "/v1/chat/completions/batch",
        # llama.cpp
        "/completion", "/completions", "/infill", "/responses",
        # TGI
        "/", "/generate", "/generate_stream", "/vertex", "/v2/models/m/versions/1/infer",
        # spellings a backend would still route there
        "/Generate", "/generate/", "/%67enerate_stream", "/v1/Responses/",
    ],
)  # fmt: skip
async def test_other_generation_routes_are_refused_and_never_reach_the_model_server(
    start_sidecar, http, upstream, path: str
) -> None:
    url, seen = upstream
    sidecar = await start_sidecar(url)
    async with http.post(f"{sidecar.url}{path}", json={"inputs": "hi", "prompt": "hi", "max_tokens": 2}) as resp:
        assert resp.status == 403
        assert "Retry-After" not in resp.headers  # retrying the same route cannot help
        err = error_of(await resp.json())
    assert err["code"] == "path_not_admitted"
    assert "/v1/chat/completions" in err["message"] and "/v1/completions" in err["message"]
    assert _generation(seen) == []
    stats = sidecar.snapshot()
    assert stats.admitted_total == 0 and stats.rejected_total == {"bad_request": 1}
    assert stats.policy_rejected_total == 1 and stats.capacity_rejected_total == 0  # never buys GPUs
    async with http.get(f"{sidecar.url}/metrics") as resp:
        assert _decisions(await resp.text(), "reject", "bad_request") == 1


async def test_ordinary_paths_and_safe_methods_still_pass_through(start_sidecar, http, upstream) -> None:
    url, seen = upstream
    sidecar = await start_sidecar(url)
    async with http.get(f"{sidecar.url}/v1/models") as resp:
        assert resp.status == 200 and (await resp.json())["data"][0]["id"] == MODEL
    async with http.post(f"{sidecar.url}/tokenize", json={"model": MODEL, "prompt": "hi"}) as resp:
        assert resp.status == 200
    async with http.get(f"{sidecar.url}/") as resp:  # TGI's health, llama.cpp's web UI
        assert resp.status == 200
    async with http.post(f"{sidecar.url}/v1/embeddings", json={"model": MODEL, "input": "hi"}) as resp:
        assert resp.status == 200
    assert _generation(seen) == [("GET", "/v1/models"), ("POST", "/tokenize"), ("GET", "/"), ("POST", "/v1/embeddings")]
    stats = sidecar.snapshot()
    assert stats.admitted_total == 0 and stats.rejected_total == {}


@pytest.mark.parametrize("path", ["/v1/chat/completions%0A", "/generate%0A", "/v1/responses%0D%0A"])
async def test_a_newline_after_a_generation_route_never_reaches_the_model_server(
    start_sidecar, http, upstream, path: str
) -> None:
    # Starlette's route regexes end in `$`, which also matches before a trailing newline: vLLM would
    # serve `/v1/chat/completions\n`. The sidecar must not pass such a path through unadmitted.
    url, seen = upstream
    sidecar = await start_sidecar(url)
    async with http.post(f"{sidecar.url}{path}", json={"prompt": "hi", "max_tokens": 2}) as resp:
        assert resp.status in (400, 403, 404)
    assert _generation(seen) == [] and sidecar.snapshot().admitted_total == 0
