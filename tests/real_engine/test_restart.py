"""llama-server restarted with another shape under a running sidecar (issue #13): the sidecar, whose
pool sets no ``tokenBudget`` / ``maxConcurrency``, follows the new server within seconds instead of
admitting for slots the server no longer has."""

import asyncio
import pathlib
import subprocess
import time

import aiohttp

from tidegate.admission.reasons import CAPACITY_REASONS

from .conftest import free_port, llama_args, wait_http, wait_until
from .helpers import GREEDY, completion, post

RESIZED_WITHIN_S = 10.0
"""Bound on restart-seen-healthy -> sidecar resized; the periodic re-read alone would take up to 60 s."""


def launch(binary: str, model: str, port: int, parallel: int, ctx_size: int, log: pathlib.Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        proc = subprocess.Popen(llama_args(binary, model, port, parallel, ctx_size), stdout=out, stderr=out)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 120, proc, "llama-server")
    except RuntimeError:
        stop(proc)
        raise
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def sized(sidecar, budget: int, concurrency: int):
    s = sidecar.stats()
    ok = (s["token_budget"], s["max_concurrency"], s["token_budget_source"], s["max_concurrency_source"]) == (
        budget, concurrency, "engine", "engine",
    )  # fmt: skip
    return ok and s


async def test_a_restart_with_fewer_slots_shrinks_the_running_sidecar(llama_binaries, start_sidecar, tmp_path):
    binary, model = llama_binaries
    port, log = free_port(), tmp_path / "llama-server.log"
    url = f"http://127.0.0.1:{port}"
    proc = launch(binary, model, port, parallel=2, ctx_size=2048, log=log)
    try:
        sidecar = start_sidecar(upstream=url)
        wait_until(lambda: sized(sidecar, 2048, 2), 10, "the first sizing (2 slots x 1024)")

        killed_at = time.monotonic()
        stop(proc)  # the same port, other flags: as a pod's model server restarted with a new args list
        proc = launch(binary, model, port, parallel=1, ctx_size=1024, log=log)
        healthy_at = time.monotonic()
        stats = wait_until(lambda: sized(sidecar, 1024, 1), RESIZED_WITHIN_S, "the sidecar to follow the restart")
        now = time.monotonic()
        print(
            f"resized {now - killed_at:.2f} s after the kill, {now - healthy_at:.2f} s after the new server was healthy"
        )
        assert stats["backend_slots"] == 1 and stats["sizing_changes_total"] == 1
        assert "token budget 2048 -> 1024 (engine), max concurrency 2 -> 1 (engine)" in sidecar.log_text()

        # its one slot busy with a long answer, a second request is refused or queued, never run beside
        async with aiohttp.ClientSession() as session:
            long = completion("Write a long story:", max_tokens=400, ignore_eos=True, stream=False, **GREEDY)
            first = asyncio.create_task(post(session, sidecar.url + "/v1/completions", long))
            await asyncio.to_thread(wait_until, lambda: sidecar.stats()["in_flight_requests"] == 1, 10, "admitted")
            second = asyncio.create_task(post(session, sidecar.url + "/v1/completions", completion("Hi", max_tokens=4)))
            deadline = time.monotonic() + 10
            while not second.done() and sidecar.stats()["queue_depth"] == 0:
                assert time.monotonic() < deadline, "the second request neither refused nor queued"
                await asyncio.sleep(0.05)
            assert sidecar.stats()["in_flight_requests"] == 1 and not first.done()
            print("second request:", "answered at once" if second.done() else "queued")
            if second.done():
                status, doc, _ = second.result()
                assert status == 503 and doc["error"]["code"] in CAPACITY_REASONS, doc
            assert (await first)[0] == 200
            status, _, _ = await second
        stats = wait_until(lambda: (s := sidecar.stats())["in_flight_requests"] == 0 and s, 10, "everything released")
        assert stats["in_flight_tokens"] == 0 and stats["queue_depth"] == 0  # nothing leaked across the resize
    finally:
        stop(proc)
