"""Readers for the sim-backend component tests: request bodies, SSE events, /metrics samples."""

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tidegate.sim.server import SimBackend


def chat_body(content: str = "hello there", **extra: object) -> dict:
    return {"model": "sim-llama-3.1-8b", "messages": [{"role": "user", "content": content}], **extra}


async def read_sse(resp: aiohttp.ClientResponse) -> list[tuple[float, object]]:
    """(arrival time, parsed event) per ``data:`` event; ``[DONE]`` stays a string."""
    events = []
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append((time.monotonic(), payload if payload == "[DONE]" else json.loads(payload)))
        else:
            assert line == "", f"unexpected SSE line {line!r}"
    return events


async def scrape(http: aiohttp.ClientSession, sim: SimBackend) -> dict[str, float]:
    """Samples of ``/metrics`` by name (labels dropped; histogram buckets left out)."""
    async with http.get(sim.url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_bucket"):
                out[sample.name] = sample.value
    return out


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)
