"""Reservations against a real llama-server: no request field lets a client generate more than
it reserved, and a request the server can hold is never refused as too large."""

import aiohttp

from .helpers import CTX_PER_SLOT, GREEDY, chat, completion, post


async def reserved_for(sidecar, session, path: str, body: dict) -> tuple[int, int, dict]:
    """(status, tokens the sidecar reserved for the request, answer)."""
    before = sidecar.stats()["admitted_tokens_total"]
    status, doc, _ = await post(session, sidecar.url + path, body)
    return status, sidecar.stats()["admitted_tokens_total"] - before, doc


async def test_n_predict_cannot_generate_past_the_reservation(llama_server, start_sidecar):
    """llama.cpp's ``n_predict`` overrides ``max_tokens``: it must be reserved."""
    sidecar = start_sidecar(tokenizer="backend")
    body = completion("Once upon a time", max_tokens=4, n_predict=300, ignore_eos=True, **GREEDY)
    async with aiohttp.ClientSession() as session:
        status, reserved, doc = await reserved_for(sidecar, session, "/v1/completions", body)
    assert status == 200
    assert doc["usage"]["completion_tokens"] == 300  # the server did generate 300 ...
    assert reserved >= doc["usage"]["prompt_tokens"] + 300  # ... and all of them were reserved


async def test_n_cmpl_sequences_are_each_reserved(llama_server, start_sidecar):
    """``n_cmpl`` is llama.cpp's alias of ``n``: two completions hold two sequences."""
    sidecar = start_sidecar(tokenizer="backend")
    body = completion("The colour of grass is", max_tokens=6, n_cmpl=2, ignore_eos=True, **GREEDY)
    async with aiohttp.ClientSession() as session:
        status, reserved, doc = await reserved_for(sidecar, session, "/v1/completions", body)
    assert status == 200 and len(doc["choices"]) == 2
    assert reserved >= doc["usage"]["prompt_tokens"] + 2 * 6


async def test_a_full_context_budget_admits_what_one_slot_holds(llama_server, start_sidecar):
    """``tokenBudget == maxContextTokens`` (one slot's worth): a chat without ``max_tokens`` (it may
    fill the context) and a long prompt that the estimate over-counts are both served, not 413."""
    sidecar = start_sidecar(admission={"tokenBudget": CTX_PER_SLOT})
    long_prompt = "hello " * 500  # ~500 real tokens; the 3-chars-per-token estimate says ~1000
    async with aiohttp.ClientSession() as session:
        status, doc, _ = await post(session, sidecar.url + "/v1/chat/completions", chat("Say hi.", **GREEDY))
        assert status == 200, doc
        status, doc, _ = await post(
            session, sidecar.url + "/v1/chat/completions", chat(long_prompt, max_tokens=8, **GREEDY)
        )
        assert status == 200, doc
