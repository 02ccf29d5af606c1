"""Poll cost per pod of the scaler's sidecar signal source, for 10, 100 and 2,000 pods.

A child process serves N lightweight stats endpoints (one port each, raw asyncio, a realistic
``StatsSnapshot`` document with 10 tenants and a fresh ``time_s`` per request). This process
runs the real ``SidecarSignals.observe`` (concurrent aiohttp GETs, pydantic parsing, counter
deltas, the observation sum) against them, poll after poll, and reports the scaler's own CPU time
per pod (``time.process_time``, median over polls; the stats servers' CPU is in the other
process) and the wall time per poll. Target (issue 5): flat, 2,000-pod cost per pod <= 1.2x the 10-pod cost.

Not a test and not a CI gate. Run: ``.venv/bin/python bench/scaler_poll.py [--pods 10 100 2000] [--polls 20]``
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import time

from tidegate.admission.reasons import Reason
from tidegate.admission.stats import StatsSnapshot, TenantCounters
from tidegate.api.scaling import ScalingSpec
from tidegate.scaler.metadata import Target
from tidegate.scaler.pods import PodInfo, StaticPodSource
from tidegate.scaler.sidecar import SidecarSignals


def _document() -> bytes:
    tenants = {
        f"tenant-{i}": TenantCounters(admitted=1000 * i, admitted_tokens=10**6, capacity_rejected=i) for i in range(10)
    }
    snap = StatsSnapshot(
        pool="bench",
        pod="bench-0",
        instance_id="bench",
        started_at_s=time.time() - 3600,
        time_s=0.0,
        admitted_total=123_456,
        admitted_tokens_total=10**8,
        rejected_total={Reason.QUEUE_FULL: 321, Reason.TENANT_RATE: 12},
        tenants=tenants,
        in_flight_tokens=40_000,
        token_budget=65_536,
        max_concurrency=64,
        queue_depth=3,
        kv_cache_usage=0.7,
        telemetry_age_s=0.4,
    )
    return snap.model_dump_json().replace('"time_s":0.0', '"time_s":%TIME%').encode()


def _serve(n: int, ports: "multiprocessing.Queue[list[int]]") -> None:
    template = _document()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counter = 0
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                counter += 1
                body = template.replace(b"%TIME%", repr(time.time()).encode())
                head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                writer.write(head + body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        servers = [await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024) for _ in range(n)]
        ports.put([s.sockets[0].getsockname()[1] for s in servers])
        await asyncio.Event().wait()

    asyncio.run(main())


async def _measure(n: int, polls: int, warmup: int) -> dict[str, float]:
    queue: multiprocessing.Queue[list[int]] = multiprocessing.Queue()
    child = multiprocessing.Process(target=_serve, args=(n, queue), daemon=True)
    child.start()
    try:
        ports = queue.get(timeout=120)
        pods = [PodInfo(f"bench-{i}", f"http://127.0.0.1:{p}") for i, p in enumerate(ports)]
        source = StaticPodSource({("bench", "bench"): pods})
        signals = SidecarSignals(source, timeout_s=10.0, max_connections=n + 16)
        target = Target("bench", "bench", ScalingSpec())
        cpu, wall = [], []
        for i in range(warmup + polls):
            c0, w0 = time.process_time(), time.perf_counter()
            obs = await signals.observe(target)
            c1, w1 = time.process_time(), time.perf_counter()
            assert len(obs.stale) == 0 and obs.fresh == n, f"only {obs.fresh} of {n} answered"
            if i >= warmup:
                cpu.append((c1 - c0) / n)
                wall.append(w1 - w0)
            await asyncio.sleep(0.05)
        await signals.close()
        return {"cpu_per_pod_us": statistics.median(cpu) * 1e6, "wall_ms": statistics.median(wall) * 1e3}
    finally:
        child.terminate()
        child.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, nargs="+", default=[10, 100, 2000])
    parser.add_argument("--polls", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    # at least 4,000 pod fetches per row, so the small pools are not measured on a handful of polls
    rows = [(n, asyncio.run(_measure(n, max(args.polls, -(-4000 // n)), args.warmup))) for n in args.pods]
    base = rows[0][1]["cpu_per_pod_us"]
    print(f"{'pods':>6} | {'scaler CPU per pod (us)':>23} | {'vs first':>8} | {'wall per poll (ms)':>18}")
    print(f"{'-' * 6}-+-{'-' * 23}-+-{'-' * 8}-+-{'-' * 18}")
    for n, r in rows:
        print(f"{n:>6} | {r['cpu_per_pod_us']:>23.0f} | {r['cpu_per_pod_us'] / base:>7.2f}x | {r['wall_ms']:>18.1f}")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (the figures are noisy on a busy machine)")
    print(json.dumps({"rows": {n: r for n, r in rows}}))


if __name__ == "__main__":
    main()
