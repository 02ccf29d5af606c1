"""The sidecar in front of a real llama-server: answers pass through unchanged and every token is
accounted from the server's own usage (never estimated)."""

import aiohttp
import pytest

from .helpers import GREEDY, answer_text, chat, completion, post, stream, streamed_text

USAGE_MISSING = "tidegate_admission_usage_missing_total"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_answers_are_identical_direct_and_through_the_sidecar(llama_server, start_sidecar, path):
    sidecar = start_sidecar()
    body = (chat if "chat" in path else completion)("Name three colours.", max_tokens=24, **GREEDY)
    async with aiohttp.ClientSession() as session:
        direct_status, direct, _ = await post(session, llama_server.url + path, body)
        via_status, via, _ = await post(session, sidecar.url + path, body)
        assert direct_status == via_status == 200
        assert answer_text(via) == answer_text(direct) and answer_text(via)
        counts = ("prompt_tokens", "completion_tokens", "total_tokens")  # not cached_tokens: the cache is warm now
        assert {k: via["usage"][k] for k in counts} == {k: direct["usage"][k] for k in counts}

        _, direct_events = await stream(session, llama_server.url + path, body)
        _, via_events = await stream(session, sidecar.url + path, body)
        assert streamed_text(via_events) == streamed_text(direct_events) == answer_text(direct)
        assert via_events[-1] == "[DONE]"
    assert sidecar.stats()["in_flight_requests"] == 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_usage_is_read_from_the_server_streamed_or_not(llama_server, start_sidecar, path):
    """llama.cpp's streamed completions carry usage on the last chunk beside its choices: it must
    be read there (else every request is charged an estimate and counted as usage missing)."""
    sidecar = start_sidecar()
    make = chat if "chat" in path else completion
    async with aiohttp.ClientSession() as session:
        for i in range(2):
            status, _, _ = await post(session, sidecar.url + path, make(f"Say {i}.", max_tokens=8, **GREEDY))
            assert status == 200
            status, events = await stream(session, sidecar.url + path, make(f"Count {i}.", max_tokens=8, **GREEDY))
            assert status == 200 and events[-1] == "[DONE]"
            # the client did not ask for usage, so it does not get a usage-only chunk it never asked for
            assert not any(isinstance(e, dict) and not e.get("choices") and e.get("usage") for e in events)
    assert sidecar.metric(USAGE_MISSING) == 0
    assert sidecar.stats()["completed_total"] == 4


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_backend_tokenizer_counts_the_prompt_exactly(llama_server, start_sidecar, path):
    """``tokenizer: backend``: the reservation is the server's own prompt count plus max_tokens
    (chat prompts through the server's chat template, not an estimate)."""
    sidecar = start_sidecar(tokenizer="backend")
    make = chat if "chat" in path else completion
    body = make("Explain, in one sentence, why the sky is blue during the day.", max_tokens=5, **GREEDY)
    async with aiohttp.ClientSession() as session:
        before = sidecar.stats()["admitted_tokens_total"]
        status, doc, _ = await post(session, sidecar.url + path, body)
        assert status == 200
        reserved = sidecar.stats()["admitted_tokens_total"] - before
    assert reserved == doc["usage"]["prompt_tokens"] + 5
