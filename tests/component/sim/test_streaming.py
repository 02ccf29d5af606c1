"""The sim-backend over loopback: what an OpenAI client (and the sidecar in front) sees."""

import asyncio
import itertools
import statistics

from tests.component.sim.helpers import chat_body, read_sse, scrape
from tidegate.sim import tokenizer


async def test_stream_arrives_token_by_token_with_the_modelled_gaps(start_sim, http) -> None:
    sim = await start_sim(decode_tokens_per_s=20)  # one token every 50 ms
    async with http.post(sim.url + "/v1/chat/completions", json=chat_body(max_tokens=10, stream=True)) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await read_sse(resp)
    assert events[-1][1] == "[DONE]"
    chunks = [e for _, e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    token_chunks = chunks[1:]
    assert [c["choices"][0]["delta"]["content"] for c in token_chunks] == list(tokenizer.output_texts(0, 10))
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None] * 9 + ["length"]
    assert all("usage" not in c for c in chunks)  # no include_usage: no usage anywhere
    arrivals = [t for t, _ in events[1:-1]]
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert abs(statistics.median(gaps) - 0.050) < 0.010, gaps
    # tokens are paced by model time, so one late wake-up does not push the later tokens back
    assert abs((arrivals[-1] - arrivals[0]) - 9 * 0.050) < 0.030, gaps


async def test_time_scale_runs_the_model_faster_than_real_time(start_sim, http) -> None:
    sim = await start_sim(decode_tokens_per_s=20, time_scale=4)  # 50 ms of model time = 12.5 ms
    body = {"prompt": "once upon a time", "max_tokens": 12, "stream": True}
    async with http.post(sim.url + "/v1/completions", json=body) as resp:
        events = await read_sse(resp)
    arrivals = [t for t, e in events if e != "[DONE]"]
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert abs(statistics.median(gaps) - 0.0125) < 0.006, gaps
    assert events[-2][1]["choices"][0]["finish_reason"] == "length"
    assert events[0][1]["object"] == "text_completion"


async def test_usage_chunk_only_when_include_usage_is_true(start_sim, http) -> None:
    sim = await start_sim(decode_tokens_per_s=2000)
    content = "count my tokens please"
    prompt_tokens = tokenizer.count(tokenizer.render_chat([{"role": "user", "content": content}]))
    for options, expect_usage in (({"include_usage": True}, True), ({"include_usage": False}, False), (None, False)):
        body = chat_body(content, max_tokens=5, stream=True)
        if options is not None:
            body["stream_options"] = options
        async with http.post(sim.url + "/v1/chat/completions", json=body) as resp:
            chunks = [e for _, e in await read_sse(resp)][:-1]
        with_usage = [c for c in chunks if "usage" in c]
        if expect_usage:
            assert with_usage == [chunks[-1]]
            assert chunks[-1]["choices"] == []
            assert chunks[-1]["usage"] == {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 5,
                "total_tokens": prompt_tokens + 5,
            }
        else:
            assert with_usage == []


async def test_non_streamed_response_with_n_choices_and_usage(start_sim, http) -> None:
    sim = await start_sim(decode_tokens_per_s=2000)
    body = chat_body(max_completion_tokens=4, max_tokens=1, n=2)
    async with http.post(sim.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        data = await resp.json()
    assert data["object"] == "chat.completion"
    assert [c["index"] for c in data["choices"]] == [0, 1]
    assert all(c["message"]["content"] == "".join(tokenizer.output_texts(0, 4)) for c in data["choices"])
    assert data["usage"]["completion_tokens"] == 8  # max_completion_tokens wins over max_tokens, times n
    # an early end of sequence (sim extension) finishes with "stop" before the cap
    body = {"prompt": "p", "max_tokens": 50, "sim_output_tokens": 3}
    async with http.post(sim.url + "/v1/completions", json=body) as resp:
        data = await resp.json()
    assert data["choices"][0]["finish_reason"] == "stop" and data["usage"]["completion_tokens"] == 3


async def test_tokenize_and_models_agree_with_usage(start_sim, http) -> None:
    sim = await start_sim(model_name="tiny", kv_capacity_tokens=5000)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is a token?"}]
    async with http.post(sim.url + "/tokenize", json={"messages": messages}) as resp:
        tok = await resp.json()
    async with http.post(
        sim.url + "/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 1}
    ) as resp:
        usage = (await resp.json())["usage"]
    assert tok["count"] == len(tok["tokens"]) == usage["prompt_tokens"]
    async with http.post(sim.url + "/tokenize", json={"prompt": "abcdefgh"}) as resp:
        assert (await resp.json())["count"] == 2
    async with http.get(sim.url + "/v1/models") as resp:
        models = await resp.json()
    assert [m["id"] for m in models["data"]] == ["tiny"] and models["data"][0]["max_model_len"] == 5000


async def test_bad_requests_get_openai_errors(start_sim, http) -> None:
    sim = await start_sim(kv_capacity_tokens=1000)
    cases = [
        (b"not json", 400),
        (b'{"messages": "nope"}', 400),
        (b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}', 404),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}', 400),
    ]
    for raw, status in cases:
        async with http.post(
            sim.url + "/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == status, raw
            error = (await resp.json())["error"]
            assert error["code"] == status and error["message"]
    assert "maximum context length is 1000" in error["message"]
    assert (await scrape(http, sim))["vllm:num_requests_running"] == 0


async def test_kv_pressure_shows_as_preemptions_in_metrics(start_sim, http) -> None:
    sim = await start_sim(kv_capacity_tokens=300, max_model_len=200, decode_tokens_per_s=1000, time_scale=5)
    body = {"prompt": "x" * 160, "max_tokens": 100}  # 40 prompt tokens; 4 x 140 > 300
    responses = await asyncio.gather(*(http.post(sim.url + "/v1/completions", json=body) for _ in range(4)))
    for resp in responses:
        assert (await resp.json())["usage"]["completion_tokens"] == 100
        resp.release()
    samples = await scrape(http, sim)
    assert samples["vllm:num_preemptions_total"] > 0
    assert samples["vllm:generation_tokens_total"] == 400
    assert samples["vllm:kv_cache_usage_perc"] == 0
