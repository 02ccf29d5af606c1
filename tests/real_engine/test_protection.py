"""Overload, disconnects, the server's own errors and one tenant's bad requests, against a real
llama-server (2 slots): the sidecar keeps the server's own queue empty and other tenants served."""

import asyncio
import contextlib

import aiohttp

from .conftest import get_json, wait_until
from .helpers import GREEDY, SLOTS, chat, completion, error_of, leave_mid_stream, post, stream

LONG = {"max_tokens": 200, "ignore_eos": True, **GREEDY}


async def test_overload_is_refused_with_retry_after_and_never_queues_in_the_server(llama_server, start_sidecar):
    sidecar = start_sidecar(admission={"maxConcurrency": SLOTS, "queue": {"maxDepth": 0}})
    deferred: list[float] = []
    done = asyncio.Event()

    async def watch_server() -> None:
        while not done.is_set():
            deferred.append(await asyncio.to_thread(llama_server.metric, "requests_deferred"))
            await asyncio.sleep(0.05)

    async with aiohttp.ClientSession() as session:
        watcher = asyncio.create_task(watch_server())
        answers = await asyncio.gather(
            *(
                post(session, sidecar.url + "/v1/completions", completion(f"Story {i}:", **LONG))
                for i in range(3 * SLOTS)
            )
        )
        done.set()
        await watcher
    served = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] != 200]
    assert len(served) == SLOTS and len(refused) == 2 * SLOTS
    for status, doc, headers in refused:
        assert status == 503 and error_of(doc)["code"] in ("concurrency", "queue_full")
        assert float(headers["Retry-After"]) >= 1 and "retry-after-ms" in {k.lower() for k in headers}
    assert deferred and max(deferred) == 0  # the server never queued anything itself


async def test_disconnect_mid_stream_frees_the_reservation_and_stops_generation(llama_server, start_sidecar):
    sidecar = start_sidecar()
    async with aiohttp.ClientSession() as session:

        def one_in_flight() -> None:
            assert sidecar.stats()["in_flight_requests"] == 1

        await leave_mid_stream(
            session, sidecar.url + "/v1/completions", completion("Tell a story:", **LONG), one_in_flight
        )  # the client goes away mid-stream
    wait_until(lambda: sidecar.stats()["in_flight_requests"] == 0, 5, "the reservation to be released")
    assert sidecar.stats()["in_flight_tokens"] == 0
    wait_until(lambda: llama_server.busy_slots() == 0, 5, "the server to stop generating")
    before = llama_server.metric("tokens_predicted_total")
    await asyncio.sleep(0.5)
    assert llama_server.metric("tokens_predicted_total") == before  # nothing is generating for nobody


async def test_a_conversation_id_does_not_keep_generating_after_the_client_left(llama_server, start_sidecar):
    """llama.cpp keeps a stream sent with ``X-Conversation-Id`` generating after its client is gone
    (resumable streams): forwarded, the sidecar would free the reservation of a slot still busy."""
    sidecar = start_sidecar()
    async with aiohttp.ClientSession() as session:
        await leave_mid_stream(
            session, sidecar.url + "/v1/completions", completion("Tell a story:", **{**LONG, "max_tokens": 900}),
            **{"X-Conversation-Id": "resume-me"},
        )  # fmt: skip
    wait_until(lambda: sidecar.stats()["in_flight_requests"] == 0, 5, "the reservation to be released")
    wait_until(lambda: llama_server.busy_slots() == 0, 2, "the server to stop generating")  # 900 tokens: ~15 s


async def test_a_body_that_aborts_the_server_is_refused_before_it(llama_server, start_sidecar):
    """An unknown ``grammar_triggers`` type makes llama-server abort (``GGML_ASSERT`` in
    ``common_sampler_init``): one request would end every other tenant's generation."""
    sidecar = start_sidecar()
    body = completion("hi", max_tokens=3, grammar_triggers=[{"type": 99, "value": "x"}])
    async with aiohttp.ClientSession() as session:
        status, doc, _ = await post(session, sidecar.url + "/v1/completions", body)
    assert status == 400 and error_of(doc)["param"] == "grammar_triggers"
    assert llama_server.busy_slots() == 0  # the server still answers


async def test_a_tenant_cannot_pin_a_busy_slot_and_hold_the_others(llama_server, start_sidecar):
    """Measured before: with slot 0 busy, ``id_slot: 0`` made llama-server defer the request while
    slot 1 was free; the sidecar saw the server queueing and refused every other tenant."""
    sidecar = start_sidecar(admission={"tenancy": {"identity": "header"}})
    async with aiohttp.ClientSession() as session:
        long = asyncio.create_task(
            post(session, sidecar.url + "/v1/completions", completion("Story:", **LONG), **{"x-tenant-id": "a"})
        )
        for _ in range(100):  # the event loop must run for the request to go out: no blocking wait_until
            if await asyncio.to_thread(llama_server.busy_slots) == 1:
                break
            await asyncio.sleep(0.05)
        busy = next(slot["id"] for slot in get_json(llama_server.url + "/slots") if slot["is_processing"])
        pinned = completion("hi", max_tokens=3, id_slot=busy)
        status, doc, _ = await post(session, sidecar.url + "/v1/completions", pinned, **{"x-tenant-id": "b"})
        assert status == 400 and error_of(doc)["param"] == "id_slot"
        status, _, _ = await post(
            session, sidecar.url + "/v1/completions", completion("hello", max_tokens=3), **{"x-tenant-id": "c"}
        )
        assert status == 200
        assert (await long)[0] == 200


async def test_a_non_streamed_request_whose_client_left_is_held_until_the_server_is_done(llama_server, start_sidecar):
    """llama-server finishes a non-streamed generation whose client went away (0c1e570): the
    sidecar keeps its reservation until then, so it never admits work for a slot that is busy."""
    sidecar = start_sidecar()
    async with aiohttp.ClientSession() as session:
        with contextlib.suppress(TimeoutError):
            async with session.post(
                sidecar.url + "/v1/completions", json=completion("Tell a story:", **LONG),
                timeout=aiohttp.ClientTimeout(total=0.5),
            ) as resp:  # fmt: skip
                await resp.read()
    held, released_early = 0, 0
    while True:  # the sidecar's count first: it may only drop once the server is done
        in_flight = sidecar.stats()["in_flight_requests"]
        if llama_server.busy_slots() == 0:
            break
        held += in_flight == 1
        released_early += in_flight == 0
        await asyncio.sleep(0.1)
    assert held > 0  # the client left well before the answer was done ...
    assert released_early <= 1  # ... and the reservation was held for it (one sample may straddle the end)
    wait_until(lambda: sidecar.stats()["in_flight_requests"] == 0, 5, "the reservation to be released")
    assert sidecar.stats()["in_flight_tokens"] == 0


async def test_the_servers_own_errors_reach_the_client_as_openai_errors(llama_server, start_sidecar):
    sidecar = start_sidecar()
    async with aiohttp.ClientSession() as session:
        # over one slot's context: the sidecar's lower bound lets it through, the server says 400
        status, doc, _ = await post(session, sidecar.url + "/v1/completions", completion("hello " * 1500, max_tokens=4))
        assert status == 400 and error_of(doc)["message"]
        # llama.cpp answers a malformed tools array with HTTP 500
        bad_tools = chat("What is the weather?", tools=[{"type": "function", "function": {"name": 7}}], max_tokens=4)
        direct_status, _, _ = await post(session, llama_server.url + "/v1/chat/completions", bad_tools)
        status, doc, _ = await post(session, sidecar.url + "/v1/chat/completions", bad_tools)
        assert status == direct_status and status >= 400
        assert error_of(doc)["message"]
    assert sidecar.stats()["in_flight_requests"] == 0


async def test_one_tenants_malformed_requests_leave_another_tenant_served(llama_server, start_sidecar):
    """llama.cpp answers a malformed ``tools`` array with HTTP 500: eight in a row from one tenant
    (the breaker's in-a-row trip is 5) must not take the replica away from a tenant it serves."""
    sidecar = start_sidecar()
    bad_tools = chat("Weather?", tools=[{"type": "function", "function": {"name": 7}}], max_tokens=4)
    good = chat("Hi", max_tokens=4, **GREEDY)
    async with aiohttp.ClientSession() as session:
        status, doc, _ = await post(session, sidecar.url + "/v1/chat/completions", good, **{"x-tenant-id": "careful"})
        assert status == 200, doc
        for _ in range(8):
            status, doc, _ = await post(
                session, sidecar.url + "/v1/chat/completions", bad_tools, **{"x-tenant-id": "careless"}
            )
            assert status == 500 and error_of(doc)["message"]  # the server's own answer, relayed
        status, doc, _ = await post(session, sidecar.url + "/v1/chat/completions", good, **{"x-tenant-id": "careful"})
        assert status == 200, doc
    assert sidecar.stats()["breaker_state"] == "closed"


async def test_the_gate_holds_new_work_while_the_server_queues_and_reopens(llama_server, start_sidecar):
    """Admission allowed more than the server has slots (maxConcurrency 4, 2 slots): the server
    defers 2 requests in its own FIFO; the sidecar sees ``requests_deferred`` and sends nothing
    more until the server's queue is empty again; then it admits again."""
    sidecar = start_sidecar(admission={"maxConcurrency": 2 * SLOTS})
    async with aiohttp.ClientSession() as session:
        first = [
            asyncio.create_task(stream(session, sidecar.url + "/v1/completions", completion(f"Tale {i}:", **LONG)))
            for i in range(2 * SLOTS)
        ]
        await asyncio.to_thread(
            wait_until, lambda: llama_server.metric("requests_deferred") >= 1, 10, "the server to defer"
        )
        await asyncio.to_thread(
            wait_until, lambda: sidecar.stats()["backend_queue_held"], 5, "the sidecar to hold new work"
        )
        late = asyncio.create_task(post(session, sidecar.url + "/v1/completions", completion("Late:", max_tokens=4)))
        peak = 0.0
        while not late.done():
            peak = max(peak, await asyncio.to_thread(llama_server.metric, "requests_deferred"))
            await asyncio.sleep(0.05)
        assert peak <= SLOTS  # the late request never piled into the server's queue
        status, doc, _ = late.result()
        assert status in (200, 503), doc
        for task in first:
            assert (await task)[0] == 200
        status, doc, _ = await post(session, sidecar.url + "/v1/completions", completion("Again:", max_tokens=4))
        assert status == 200, doc
