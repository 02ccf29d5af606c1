"""Requests and stream reading for the real-engine tier."""

import json
from collections.abc import Callable
from typing import Any

import aiohttp

SLOTS = 2
CTX_PER_SLOT = 1024
"""The test server: ``--parallel 2 --ctx-size 2048`` gives 2 slots of 1024 tokens each."""
MODEL_ALIAS = "smollm2-135m-instruct"


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": content}], **extra}


def completion(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL_ALIAS, "prompt": prompt, **extra}


GREEDY = {"temperature": 0, "seed": 7, "top_k": 1}
"""Deterministic sampling: the same request gives the same tokens, direct or through the sidecar."""


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], **headers: str) -> tuple[int, Any, dict]:
    """(status, parsed JSON body, headers) of a non-streamed request."""
    async with session.post(url, json=body, headers=headers) as resp:
        raw = await resp.read()
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = raw.decode(errors="replace")
        return resp.status, doc, dict(resp.headers)


async def stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any], **headers: str) -> tuple[int, list]:
    """(status, events) of a streamed request; events are parsed JSON chunks and the string ``[DONE]``."""
    events: list[Any] = []
    async with session.post(url, json={**body, "stream": True}, headers=headers) as resp:
        if resp.status != 200:
            return resp.status, [json.loads(await resp.read())]
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data:"):
                payload = line[len("data:") :].strip()
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return 200, events


def streamed_text(events: list[Any]) -> str:
    """The generated text of a stream (chat deltas or completion text)."""
    parts = []
    for event in events:
        if not isinstance(event, dict):
            continue
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            parts.append(delta.get("content") or choice.get("text") or "")
    return "".join(parts)


def answer_text(doc: dict[str, Any]) -> str:
    choice = doc["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def error_of(doc: Any) -> dict[str, Any]:
    """The OpenAI error object, checking its shape."""
    assert isinstance(doc, dict) and set(doc) == {"error"}, doc
    err = doc["error"]
    assert {"message", "type", "code"} <= set(err), err
    return err


async def leave_mid_stream(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    check: Callable[[], None] | None = None,
    **headers: str,
) -> None:
    """Start a streamed request, read three events, run ``check`` (still streaming), then go away."""
    resp = await session.post(url, json={**body, "stream": True}, headers=headers)
    assert resp.status == 200
    seen = 0
    async for line in resp.content:
        seen += line.startswith(b"data:")
        if seen >= 3:
            break
    if check is not None:
        check()
    resp.close()
