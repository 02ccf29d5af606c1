"""What the sidecar costs on the wire: added latency, saturation throughput, fast refusals, floods.

All targets sit in front of the same upstream, in one run (issue 3, benchmarks (b) and (c)):

- ``direct``: the upstream itself, a minimal keep-alive HTTP/1.1 server answering a fixed
  OpenAI chat completion (raw asyncio, so the upstream is never the bottleneck);
- ``nginx``: nginx as a reverse proxy with upstream keep-alive, when an ``nginx`` binary is on PATH;
- ``bare aiohttp``: an aiohttp pass-through proxy of a few lines (the Python floor);
- ``sidecar``: ``tidegate admission`` with its full admission path (parse, cost, breaker, gate,
  tenant policy, capacity, metrics).

Each proxy process is pinned to CPU 1 (one core); the upstream and this load generator share
CPU 0 where the machine has two or more CPUs. Scenarios:

1. sequential requests (one connection): p50 / p99 latency, and p50 added over ``direct``;
2. saturation: 32 connections for ``--seconds``: requests/s, and the ratios the issue targets
   (sidecar >= 0.5x nginx, >= 0.9x bare aiohttp);
3. fast no: every request refused (``tenant_rate``, 429) by the sidecar vs the bare proxy's rate;
4. flood: p99 of an admitted tenant (2 connections) alone, then with a refused 10x flood
   (20 connections of a rate-limited tenant): the ratio (target <= 1.1).

LiteLLM (issue's reference) is not measured here: it is not installed in this environment.
Figures depend on the machine; on a shared box run it twice. Not a test, not a CI gate.
Run: ``.venv/bin/python bench/admission_proxy.py [--seconds 5] [--requests 2000]``
"""

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = sys.executable
TIDEGATE = os.path.join(os.path.dirname(PYTHON), "tidegate")
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 16}).encode()
ANSWER = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
}).encode()  # fmt: skip

UPSTREAM = textwrap.dedent(
    """
    import asyncio, sys
    ANSWER = sys.argv[2].encode()
    HEAD = b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(ANSWER)
    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\\r\\n\\r\\n")
                length = 0
                for line in head.split(b"\\r\\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                writer.write(HEAD + ANSWER)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=1024)
        async with server:
            await server.serve_forever()
    asyncio.run(main())
    """
)
BARE = textwrap.dedent(
    """
    import sys, aiohttp
    from aiohttp import web
    UP = sys.argv[1]
    async def startup(app):
        app["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    async def handle(req):
        body = await req.read()
        async with req.app["s"].request(req.method, UP + req.rel_url.raw_path_qs, data=body,
                                        headers={"Content-Type": "application/json"}) as r:
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)
    app = web.Application(); app.on_startup.append(startup); app.router.add_route("*", "/{t:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), access_log=None, print=None)
    """
)
NGINX = """
worker_processes 1; pid {tmp}/nginx.pid; error_log {tmp}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off; client_body_temp_path {tmp}; proxy_temp_path {tmp};
  fastcgi_temp_path {tmp}; uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
  upstream up {{ server 127.0.0.1:{up}; keepalive 64; }}
  server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://up; proxy_http_version 1.1;
    proxy_set_header Connection ""; proxy_buffering off; }} }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > cpu:
        os.sched_setaffinity(0, {cpu})


def spawn(args: list[str], cpu: int) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: pin(cpu))


async def wait_ready(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"nothing listening on {port}")


def request_bytes(port: int, headers: dict[str, str] | None = None) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\n{extra}\r\n"
    ).encode() + BODY


async def one_connection(
    port: int, request: bytes, stop: float, count: int | None, out: list[tuple[float, int]]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    try:
        while time.perf_counter() < stop and (count is None or done < count):
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            out.append((time.perf_counter() - started, status))
            done += 1
    finally:
        writer.close()


async def load(port: int, connections: int, seconds: float, count: int | None = None,
               headers: dict[str, str] | None = None) -> tuple[float, list[tuple[float, int]]]:  # fmt: skip
    """(requests/s, [(latency_s, status)]) with ``connections`` keep-alive connections."""
    out: list[tuple[float, int]] = []
    request = request_bytes(port, headers)
    started = time.perf_counter()
    stop = started + seconds
    await asyncio.gather(*(one_connection(port, request, stop, count, out) for _ in range(connections)))
    return len(out) / (time.perf_counter() - started), out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sidecar_config(tmp: str, name: str, admission: dict) -> str:
    path = os.path.join(tmp, f"{name}.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"pool": "bench", "model": {"name": "m", "engine": "openai", "maxContextTokens": 8192},
                   "admission": {"tokenBudget": 10_000_000, "maxConcurrency": 10_000, **admission}}, fh)  # fmt: skip
    return path


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    pin(0)
    procs: list[subprocess.Popen] = []
    tmp = tempfile.mkdtemp(prefix="tidegate-bench-")
    try:
        up = free_port()
        procs.append(spawn([PYTHON, "-c", UPSTREAM, str(up), ANSWER.decode()], 0))
        targets = {"direct": up}
        if shutil.which("nginx"):
            port = free_port()
            conf = os.path.join(tmp, "nginx.conf")
            with open(conf, "w", encoding="utf-8") as fh:
                fh.write(NGINX.format(tmp=tmp, up=up, port=port))
            procs.append(spawn(["nginx", "-c", conf, "-p", tmp, "-g", "daemon off;"], 1))
            targets["nginx"] = port
        targets["bare aiohttp"] = free_port()
        procs.append(spawn([PYTHON, "-c", BARE, f"http://127.0.0.1:{up}", str(targets["bare aiohttp"])], 1))
        targets["sidecar"] = free_port()
        config = sidecar_config(tmp, "open", {})
        procs.append(spawn([TIDEGATE, "admission", "--config", config, "--upstream", f"http://127.0.0.1:{up}",
                            "--listen", f"127.0.0.1:{targets['sidecar']}", "--log-level", "WARNING"], 1))  # fmt: skip
        refuse_port, flood_port = free_port(), free_port()
        refuse = sidecar_config(tmp, "refuse", {"tenancy": {"default": {"tokensPerSecond": 0.001, "burstTokens": 40}}})
        flood = sidecar_config(tmp, "flood", {"tenancy": {"identity": "header", "tenants": [
            {"name": "flood", "tokensPerSecond": 0.001, "burstTokens": 40}]}})  # fmt: skip
        for port, cfg in ((refuse_port, refuse), (flood_port, flood)):
            procs.append(spawn([TIDEGATE, "admission", "--config", cfg, "--upstream", f"http://127.0.0.1:{up}",
                                "--listen", f"127.0.0.1:{port}", "--log-level", "WARNING"], 1))  # fmt: skip
        for port in (*targets.values(), refuse_port, flood_port):
            await wait_ready(port)
        for port in targets.values():  # warm up connection pools
            await load(port, 4, 0.5)

        print(f"1. sequential, {args.requests} requests, one connection")
        print(f"   {'target':<14}{'p50 ms':>9}{'p99 ms':>9}{'added p50 ms':>14}")
        p50s = {}
        for name, port in targets.items():
            _, samples = await load(port, 1, 600, count=args.requests)
            lat = [s for s, _ in samples]
            p50s[name] = pct(lat, 0.5) * 1000
            print(f"   {name:<14}{p50s[name]:>9.3f}{pct(lat, 0.99) * 1000:>9.3f}{p50s[name] - p50s['direct']:>14.3f}")

        print(f"2. saturation, 32 connections, {args.seconds:g} s")
        rates = {}
        for name, port in targets.items():
            rates[name], samples = await load(port, 32, args.seconds)
            assert all(status == 200 for _, status in samples), name
            print(f"   {name:<14}{rates[name]:>9.0f} req/s")
        if "nginx" in rates:
            print(f"   sidecar / nginx        {rates['sidecar'] / rates['nginx']:.2f}x (target >= 0.5)")
        print(f"   sidecar / bare aiohttp {rates['sidecar'] / rates['bare aiohttp']:.2f}x (target >= 0.9)")

        print(f"3. fast no: every request refused, 32 connections, {args.seconds:g} s")
        await load(refuse_port, 1, 600, count=1)  # drains the bucket
        refused, samples = await load(refuse_port, 32, args.seconds)
        statuses = {status for _, status in samples}
        print(f"   sidecar refusals {refused:>9.0f} req/s (statuses {sorted(statuses)}), "
              f"{refused / rates['bare aiohttp']:.2f}x the bare proxy's pass-through (target >= 1)")  # fmt: skip

        print(f"4. flood: admitted tenant (2 connections) p99, alone and under a 10x refused flood, {args.seconds:g} s")
        good = {"x-tenant-id": "good"}
        _, alone = await load(flood_port, 2, args.seconds, headers=good)
        await load(flood_port, 1, 600, count=1, headers={"x-tenant-id": "flood"})

        async def flood_load() -> list[tuple[float, int]]:
            return (await load(flood_port, 20, args.seconds, headers={"x-tenant-id": "flood"}))[1]

        (_, under), flooded = await asyncio.gather(load(flood_port, 2, args.seconds, headers=good), flood_load())
        p99_alone = pct([s for s, _ in alone], 0.99) * 1000
        p99_flood = pct([s for s, st in under if st == 200], 0.99) * 1000
        refused_share = sum(st == 429 for _, st in flooded) / max(1, len(flooded))
        print(f"   p99 alone {p99_alone:.3f} ms, under flood {p99_flood:.3f} ms: ratio {p99_flood / p99_alone:.2f} "
              f"(target <= 1.1); flood refused {refused_share:.0%}")  # fmt: skip
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
