"""What the sidecar costs on the wire: added latency, saturation throughput, fast refusals, floods.

All targets sit in front of the same upstream, in one run (issue 3, benchmarks (b) and (c)):

- ``direct``: the upstream itself, a minimal keep-alive HTTP/1.1 server answering a fixed
  OpenAI chat completion (raw asyncio, so the upstream is never the bottleneck);
- ``nginx``: nginx as a reverse proxy with upstream keep-alive (and no per-connection request
  cap), when an ``nginx`` binary is on PATH (Debian: ``apt-get install nginx``);
- ``bare aiohttp``: an aiohttp pass-through proxy of a few lines (the Python floor), on the same
  event loop as the sidecar (``--loop``);
- ``sidecar``: ``tidegate admission`` with its full admission path (parse, cost, breaker, gate,
  tenant policy, capacity, metrics);
- ``litellm`` (with ``--litellm``): the LiteLLM proxy (one uvicorn worker, no master key, the
  upstream as model ``openai/m``), from its own venv under
  ``${XDG_CACHE_HOME:-~/.cache}/tidegate/bench-litellm``, created on first use
  (``pip install 'litellm[proxy]'``; never a tidegate dependency).

Each proxy process is pinned to CPU 1 (one core); the upstream and the load generators share
CPU 0 where the machine has two or more CPUs. ``cpu µs/req`` is the proxy's own CPU time (its
process and children, from /proc) per answered request: steadier than req/s on a shared machine.
Scenarios 1 and 2 run in ``--rounds`` rounds, the targets taking turns, and keep each target's
best round (a busy neighbour slows a round; nothing makes one faster than the target can be).
Scenarios:

1. sequential requests (one connection): p50 / p99 latency, and p50 added over ``direct``;
2. saturation: 32 connections for ``--seconds``: requests/s and the ratios the issue targets
   (sidecar >= 0.5x nginx, >= 0.9x bare aiohttp, >= 20x LiteLLM);
3. refusals, 32 connections: the fast no (refused before the body is read: the tenant's bucket
   is empty) and a refusal after the body is parsed and costed (bucket short of this request's
   cost: how a flooding tenant is refused most of the time); each vs the bare proxy's rate;
4. flood: p99 of an admitted tenant alone, then with a refused flood (a tenant over its rate),
   then alone again (target ratio <= 1.1). 4a is the issue's "10x overload": the admitted tenant
   paced at ``--admitted-rate`` (200 req/s: more than one GPU replica serves) and the flood
   paced at 10x that; 4b is a flood that saturates the sidecar's core (20 connections back to
   back against 2): a single event loop then shares its core among all connections, and that
   ratio shows it. The flood runs in its own process at nice 19, so neither the admitted tenant's
   load generator nor the upstream waits behind it on CPU 0: what is left is the sidecar's own
   interference.

Where the sidecar's CPU goes (py-spy, saturation): aiohttp's server and client ~65%, JSON parse and
cost estimate ~7%, engine decide/release and metrics ~10%. A home-made HTTP/1.1 client on
``httptools`` for the admitted path was measured (143-147 µs CPU per request, 0.87-0.96x the bare
proxy) and not kept: the project uses a well-kept library over its own code outside admission, so
the sidecar pays aiohttp's client like the bare proxy does, plus admission.

Figures depend on the machine; on a shared box run it twice. Not a test, not a CI gate.
Run: ``.venv/bin/python bench/admission_proxy.py [--seconds 5] [--requests 2000] [--litellm]``
"""

import argparse
import asyncio
import json
import os
import random
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
LITELLM_VENV = os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tidegate", "bench-litellm"
)
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 16}).encode()


def answer(total_tokens: int) -> bytes:
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": total_tokens - 1, "completion_tokens": 1, "total_tokens": total_tokens},
    }).encode()  # fmt: skip


ANSWER = answer(10)

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
    loop = None
    if sys.argv[3] == "uvloop":
        import uvloop
        loop = uvloop.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), access_log=None, print=None, loop=loop)
    """
)
NGINX = """
worker_processes 1; pid {tmp}/nginx.pid; error_log {tmp}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off; client_body_temp_path {tmp}; proxy_temp_path {tmp};
  fastcgi_temp_path {tmp}; uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
  keepalive_requests 1000000; keepalive_timeout 600s;
  upstream up {{ server 127.0.0.1:{up}; keepalive 64; keepalive_requests 1000000; keepalive_timeout 600s; }}
  server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://up; proxy_http_version 1.1;
    proxy_set_header Connection ""; proxy_buffering off; }} }}
}}
"""
# (nginx closes a client or upstream keep-alive connection after 1000 requests by default)
LITELLM_CONFIG = """
model_list:
  - model_name: m
    litellm_params: {{model: openai/m, api_base: "http://127.0.0.1:{up}/v1", api_key: bench}}
litellm_settings: {{telemetry: false}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin(cpu: int, nice: int = 0) -> None:
    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > cpu:
        os.sched_setaffinity(0, {cpu})
    if nice:
        os.nice(nice)


def spawn(args: list[str], cpu: int, env: dict[str, str] | None = None, **kwargs: object) -> subprocess.Popen:
    kwargs.setdefault("stdout", subprocess.DEVNULL)
    kwargs.setdefault("stderr", subprocess.DEVNULL)
    return subprocess.Popen(args, preexec_fn=lambda: pin(cpu), env=env, **kwargs)  # type: ignore[call-overload]


def cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of ``pid`` and its live children (nginx, uvicorn workers); None off Linux."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(entry) == pid or int(fields[1]) == pid:  # fields[1]: the parent pid
                total += (int(fields[11]) + int(fields[12])) / tick
    except OSError:
        return None
    return total


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
    port: int, request: bytes, stop: float, count: int | None, out: list[tuple[float, int]], interval_s: float = 0.0
) -> None:
    """Requests back to back, or one every ``interval_s`` (paced: latency counts from the send time)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    due = time.perf_counter() + random.uniform(0, interval_s)  # connections out of step
    try:
        while time.perf_counter() < stop and (count is None or done < count):
            if interval_s:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                due += interval_s
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            chunked = False
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
                elif line.lower() == b"transfer-encoding: chunked":
                    chunked = True
            if chunked:  # LiteLLM's uvicorn may answer chunked
                while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
                    await reader.readexactly(size + 2)
                await reader.readuntil(b"\r\n")
            else:
                await reader.readexactly(length)
            out.append((time.perf_counter() - started, status))
            done += 1
    finally:
        writer.close()


async def load(port: int, connections: int, seconds: float, count: int | None = None,
               headers: dict[str, str] | None = None, rate: float = 0.0) -> tuple[float, list[tuple[float, int]]]:  # fmt: skip
    """(requests/s, [(latency_s, status)]) with ``connections`` keep-alive connections; ``rate``
    > 0 paces them to that many requests/s in all (0: as fast as answers come)."""
    out: list[tuple[float, int]] = []
    request = request_bytes(port, headers)
    started = time.perf_counter()
    stop = started + seconds
    interval = connections / rate if rate > 0 else 0.0
    await asyncio.gather(*(one_connection(port, request, stop, count, out, interval) for _ in range(connections)))
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


def resolve_loop(choice: str) -> str:
    if choice != "auto":
        return choice
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def ensure_litellm() -> str:
    """The ``litellm`` CLI of the bench venv, installed on first use; raises RuntimeError with why not."""
    exe = os.path.join(LITELLM_VENV, "bin", "litellm")
    if not os.path.exists(exe):
        print(f"installing litellm[proxy] into {LITELLM_VENV} (once) ...", flush=True)
        steps = [[sys.executable, "-m", "venv", LITELLM_VENV],
                 [os.path.join(LITELLM_VENV, "bin", "pip"), "install", "-q", "litellm[proxy]"]]  # fmt: skip
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=1800)
            if done.returncode:
                raise RuntimeError(f"{' '.join(step[:3])} failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return exe


async def start_litellm(tmp: str, up: int, port: int, procs: list[subprocess.Popen]) -> str | None:
    """Start the LiteLLM proxy on ``port``; None when it answers 200, else why it cannot be measured."""
    try:
        exe = ensure_litellm()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"not installed: {exc}"
    conf = os.path.join(tmp, "litellm.yaml")
    with open(conf, "w", encoding="utf-8") as fh:
        fh.write(LITELLM_CONFIG.format(up=up))
    env = {**os.environ, "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",  # the others check no key either
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}  # fmt: skip
    log = open(os.path.join(tmp, "litellm.log"), "w+", encoding="utf-8")  # noqa: SIM115 (closed with tmp)
    procs.append(spawn([exe, "--config", conf, "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
                       1, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp))  # fmt: skip
    try:
        await wait_ready(port, timeout_s=180)
        _, samples = await load(port, 1, 30, count=1)
    except (RuntimeError, OSError, asyncio.IncompleteReadError) as exc:
        log.seek(0)
        return f"did not serve ({exc}): {log.read()[-300:]!r}"
    if samples[0][1] != 200:
        return f"answered {samples[0][1]}, not 200"
    return None


async def flood_worker(port: int, connections: int, seconds: float, tenant: str, pace: float) -> None:
    """``--flood-worker``: say ready, wait for a line on stdin, flood, print the statuses as JSON."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    rate, samples = await load(port, connections, seconds, headers={"x-tenant-id": tenant}, rate=pace)
    statuses: dict[int, int] = {}
    for _, status in samples:
        statuses[status] = statuses.get(status, 0) + 1
    print(json.dumps({"rate": rate, "statuses": statuses}), flush=True)


async def flood_round(
    port: int, pid: int, seconds: float, admitted_rate: float = 0.0
) -> tuple[list[float], list[float], dict]:
    """(admitted latencies alone, under the flood, flood summary): alone / flood / alone windows.

    ``admitted_rate`` 0: the admitted tenant and the flood run back to back (the flood saturates the
    sidecar's core); > 0: the admitted tenant is paced to that rate and the flood to 10x it.
    """
    good = {"x-tenant-id": "good"}
    pace = 10 * admitted_rate
    worker = subprocess.Popen(
        [PYTHON, __file__, "--flood-worker", str(port), "20", str(seconds), "flood", str(pace)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: pin(0, nice=19),
    )  # fmt: skip
    assert worker.stdin is not None and worker.stdout is not None
    await asyncio.get_running_loop().run_in_executor(None, worker.stdout.readline)  # started and idle
    _, before = await load(port, 2, seconds / 2, headers=good, rate=admitted_rate)
    worker.stdin.write("go\n")
    worker.stdin.flush()
    cpu_before, wall_before = cpu_s(pid), time.perf_counter()
    _, under = await load(port, 2, seconds, headers=good, rate=admitted_rate)
    cpu_after, wall_after = cpu_s(pid), time.perf_counter()
    summary = json.loads(await asyncio.get_running_loop().run_in_executor(None, worker.stdout.readline))
    if cpu_before is not None and cpu_after is not None:
        summary["busy"] = (cpu_after - cpu_before) / (wall_after - wall_before)
    worker.wait(timeout=30)
    _, after = await load(port, 2, seconds / 2, headers=good, rate=admitted_rate)
    alone = [s for s, st in before + after if st == 200]
    return alone, [s for s, st in under if st == 200], summary


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument(
        "--admitted-rate",
        type=float,
        default=200.0,
        help="scenario 4a: the admitted tenant's paced rate (req/s); the flood is paced to 10x it",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of scenarios 1 and 2; the best counts")
    parser.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                        help="event loop of the sidecar and of the bare aiohttp proxy (auto: uvloop if installed)")  # fmt: skip
    parser.add_argument("--litellm", action="store_true", help=f"add the LiteLLM proxy (venv: {LITELLM_VENV})")
    parser.add_argument("--flood-worker", nargs=5, metavar=("PORT", "CONNECTIONS", "SECONDS", "TENANT", "RATE"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args()
    if args.flood_worker:
        port, connections, seconds, tenant, pace = args.flood_worker
        return await flood_worker(int(port), int(connections), float(seconds), tenant, float(pace))
    loop = resolve_loop(args.loop)
    pin(0)
    procs: list[subprocess.Popen] = []
    pids: dict[str, int] = {}
    notes: list[str] = []
    tmp = tempfile.mkdtemp(prefix="tidegate-bench-")

    # an older sidecar (no --event-loop) always ran on asyncio's loop
    helped = subprocess.run([TIDEGATE, "admission", "--help"], capture_output=True, text=True).stdout
    loop_flag = ["--event-loop", loop] if "--event-loop" in helped else []
    if not loop_flag and loop != "asyncio":
        raise SystemExit("this sidecar has no --event-loop: run with --loop asyncio")

    def sidecar(config: str, port: int, up_port: int) -> subprocess.Popen:
        proc = spawn([TIDEGATE, "admission", "--config", config, "--upstream", f"http://127.0.0.1:{up_port}",
                      "--listen", f"127.0.0.1:{port}", "--log-level", "WARNING", *loop_flag], 1)  # fmt: skip
        procs.append(proc)
        return proc

    try:
        up, greedy_up = free_port(), free_port()
        procs.append(spawn([PYTHON, "-c", UPSTREAM, str(up), ANSWER.decode()], 0))
        # A request reserves 30 tokens and the limited tenants' buckets hold 30 (refilling at
        # 0.001/s). Charged the upstream's usage of 10, the bucket keeps 20 after one request: short
        # of the next one's cost, refused after its body is parsed. An upstream reporting usage of
        # 1000 empties it: every later request meets the fast no, before the body is read.
        procs.append(spawn([PYTHON, "-c", UPSTREAM, str(greedy_up), answer(1000).decode()], 0))
        targets = {"direct": up}
        if shutil.which("nginx"):
            port = free_port()
            conf = os.path.join(tmp, "nginx.conf")
            with open(conf, "w", encoding="utf-8") as fh:
                fh.write(NGINX.format(tmp=tmp, up=up, port=port))
            procs.append(spawn(["nginx", "-c", conf, "-p", tmp, "-e", f"{tmp}/error.log", "-g", "daemon off;"], 1))
            targets["nginx"], pids["nginx"] = port, procs[-1].pid
        else:
            notes.append("nginx: not on PATH, not measured")
        targets["bare aiohttp"] = free_port()
        procs.append(spawn([PYTHON, "-c", BARE, f"http://127.0.0.1:{up}", str(targets["bare aiohttp"]), loop], 1))
        pids["bare aiohttp"] = procs[-1].pid
        targets["sidecar"] = free_port()
        pids["sidecar"] = sidecar(sidecar_config(tmp, "open", {}), targets["sidecar"], up).pid
        fast_port, parsed_port, flood_port = free_port(), free_port(), free_port()
        limited = {"tenancy": {"default": {"tokensPerSecond": 0.001, "burstTokens": 30}}}
        pids["fast no"] = sidecar(sidecar_config(tmp, "fast", limited), fast_port, greedy_up).pid
        pids["parsed no"] = sidecar(sidecar_config(tmp, "parsed", limited), parsed_port, up).pid
        flood = sidecar_config(tmp, "flood", {"tenancy": {"identity": "header", "tenants": [
            {"name": "flood", "tokensPerSecond": 0.001, "burstTokens": 30}]}})  # fmt: skip
        pids["flood"] = sidecar(flood, flood_port, up).pid
        for port in (*targets.values(), fast_port, parsed_port, flood_port):
            await wait_ready(port)
        if args.litellm:
            targets["litellm"] = free_port()
            why = await start_litellm(tmp, up, targets["litellm"], procs)
            if why is None:
                pids["litellm"] = procs[-1].pid
            else:
                del targets["litellm"]
                notes.append(f"litellm: {why}")
        for port in targets.values():  # warm up connection pools
            await load(port, 4, 0.5)

        print(f"Python proxies on {loop}; proxies pinned to CPU 1, upstream and load on CPU 0; {os.cpu_count()} CPUs")
        print(f"1. sequential, {args.requests} requests (at most 20 s), one connection, best of {args.rounds} rounds")
        print(f"   {'target':<14}{'p50 ms':>9}{'p99 ms':>9}{'added p50 ms':>14}")
        best: dict[str, list[float]] = {}
        for _ in range(args.rounds):  # targets take turns, so a noisy moment hits one round, not one target
            for name, port in targets.items():
                _, samples = await load(port, 1, 20, count=args.requests)
                lat = [s for s, _ in samples]
                if name not in best or pct(lat, 0.5) < pct(best[name], 0.5):
                    best[name] = lat
        p50s = {name: pct(lat, 0.5) * 1000 for name, lat in best.items()}
        for name, lat in best.items():
            print(f"   {name:<14}{p50s[name]:>9.3f}{pct(lat, 0.99) * 1000:>9.3f}{p50s[name] - p50s['direct']:>14.3f}")
        print("   sidecar added p50 (target <= 0.3 ms): "
              f"{'pass' if p50s['sidecar'] - p50s['direct'] <= 0.3 else 'FAIL'}")  # fmt: skip

        print(f"2. saturation, 32 connections, {args.seconds:g} s, best of {args.rounds} rounds (req/s and cpu each)")
        print(f"   {'target':<14}{'req/s':>9}{'cpu µs/req':>12}{'non-200':>9}")
        rates: dict[str, float] = {}
        cpus: dict[str, float] = {}
        bad: dict[str, int] = {}
        for _ in range(args.rounds):
            for name, port in targets.items():
                before = cpu_s(pids[name]) if name in pids else None
                rate, samples = await load(port, 32, args.seconds)
                after = cpu_s(pids[name]) if name in pids else None
                rates[name] = max(rate, rates.get(name, 0.0))
                if before is not None and after is not None:
                    cpus[name] = min((after - before) / len(samples) * 1e6, cpus.get(name, float("inf")))
                bad[name] = bad.get(name, 0) + sum(status != 200 for _, status in samples)
        for name in targets:
            per = f"{cpus[name]:.0f}" if name in cpus else "-"
            print(f"   {name:<14}{rates[name]:>9.0f}{per:>12}{bad[name]:>9}")
        for name, target in (("nginx", 0.5), ("bare aiohttp", 0.9), ("litellm", 20)):
            if name in rates:
                ratio = rates["sidecar"] / rates[name]
                print(
                    f"   sidecar / {name:<13}{ratio:>6.2f}x (target >= {target:g}: {'pass' if ratio >= target else 'FAIL'})"
                )

        print(f"3. refusals (429 tenant_rate), 32 connections, {args.seconds:g} s")
        for label, port in (("fast no", fast_port), ("parsed no", parsed_port)):
            await load(port, 1, 600, count=1)  # admitted once: the bucket is empty / short of this cost
            before = cpu_s(pids[label])
            refused, samples = await load(port, 32, args.seconds)
            after = cpu_s(pids[label])
            statuses = sorted({status for _, status in samples})
            per = f"{(after - before) / len(samples) * 1e6:.0f}" if before is not None and after is not None else "-"
            ratio = refused / rates["bare aiohttp"]
            print(f"   {label:<10}{refused:>9.0f} req/s, cpu {per:>4} µs/refusal, statuses {statuses}, "
                  f"{ratio:.2f}x the bare proxy's pass-through (target >= 1: {'pass' if ratio >= 1 else 'FAIL'})")  # fmt: skip

        await load(flood_port, 1, 600, count=1, headers={"x-tenant-id": "flood"})  # the flood's bucket: short
        for admitted_rate in (args.admitted_rate, 0.0):
            title = (f"admitted tenant paced at {admitted_rate:g} req/s, a refused flood paced at 10x that"
                     if admitted_rate else "admitted tenant back to back (2 connections), flood back to back (20)")  # fmt: skip
            print(
                f"4{'a' if admitted_rate else 'b'}. flood: {title}; alone / under the flood / alone, {args.seconds:g} s"
            )
            alone, under, summary = await flood_round(flood_port, pids["flood"], args.seconds, admitted_rate)
            p99_alone, p99_flood = pct(alone, 0.99) * 1000, pct(under, 0.99) * 1000
            ratio = p99_flood / p99_alone
            print(f"   admitted p50 alone {pct(alone, 0.5) * 1000:.3f} ms, under flood {pct(under, 0.5) * 1000:.3f} ms")
            print(f"   admitted p99 alone {p99_alone:.3f} ms, under flood {p99_flood:.3f} ms: ratio {ratio:.2f} "
                  f"(target <= 1.1: {'pass' if ratio <= 1.1 else 'FAIL'})")  # fmt: skip
            busy = f", the sidecar busy {summary['busy']:.0%} of a core" if "busy" in summary else ""
            print(f"   flood: {summary['rate']:.0f} req/s, statuses {summary['statuses']}{busy}; "
                  f"admitted {len(under) / args.seconds:.0f} req/s under it, {len(alone) / args.seconds:.0f} alone")  # fmt: skip
        for note in notes:
            print(f"   note: {note}")
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
