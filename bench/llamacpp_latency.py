"""What the sidecar adds in front of a real model server: TTFT direct vs through ``tidegate admission``.

Target: llama.cpp's ``llama-server`` (built by ``e2e/engines/build-llamacpp.sh``: the llama.cpp that
the PyPI sdist llama-cpp-python 0.3.36 vendors) serving SmolLM2-135M-Instruct Q4_1 on the CPU with
``--parallel SLOTS``, and the sidecar as the pod runs it (the operator's ConfigMap for an
``engine: llamacpp`` pool). Streamed chat completions with greedy sampling; TTFT is the time from
sending the request to the first ``data:`` event (a new connection per request, for both targets:
see :func:`_ttft`). At concurrency 1 and at SLOTS concurrent streams
(every slot busy, nothing queued), the two targets take turns in ``--rounds`` rounds so a busy
neighbour slows both alike. Prints a table; never gates CI.

    .venv/bin/python bench/llamacpp_latency.py [--requests 40] [--rounds 3] [--slots 2]
"""

import argparse
import asyncio
import json
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from tidegate.api.pool import InferencePool
from tidegate.operator import names
from tidegate.operator.builders import configmap

REPO = pathlib.Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(args: list[str], log: pathlib.Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)


def _wait(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer within {timeout_s} s")


async def _ttft(url: str, tag: str, max_tokens: int) -> float:
    """Seconds from sending one streamed chat to its first ``data:`` event; the answer is read to its end.

    A minimal HTTP/1.1 client over one new connection (``Connection: close``), the same for both
    targets: a kept-alive connection to llama-server fails on the request after a stream (it closes
    the connection without saying so; the sidecar sends streamed requests with ``Connection: close``
    for that reason).
    """
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({
        "model": "smollm2", "stream": True, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": "user", "content": f"Request {tag}: write a short poem about the sea."}],
    }).encode()  # fmt: skip
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head + body)
        seen, first = b"", None
        while chunk := await reader.read(65536):
            if first is None:
                seen += chunk
                if b"data:" in seen:
                    first = time.perf_counter() - start
                    assert seen.startswith(b"HTTP/1.1 200"), seen[:200]
    finally:
        writer.close()
    assert first is not None, seen[:500]
    return first


async def _round(url: str, concurrency: int, requests: int, max_tokens: int, tag: str) -> list[float]:
    """One target's turn. Prompts are unique per turn (``tag``): a prompt the other target just
    sent would be served from llama.cpp's prompt cache and skip its prefill."""
    await _ttft(url, f"{tag}-warm-up", 2)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> float:
        async with sem:
            return await _ttft(url, f"{tag}-{i}", max_tokens)

    return list(await asyncio.gather(*(one(i) for i in range(requests))))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=40, help="requests per target, round and concurrency")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--slots", type=int, default=2, help="llama-server --parallel")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="llama-server --threads (1 leaves a core to the sidecar)")
    args = p.parse_args()
    binary, model = subprocess.run(
        [str(REPO / "e2e/engines/build-llamacpp.sh")], capture_output=True, text=True, check=True
    ).stdout.split()[-2:]
    work = pathlib.Path(tempfile.mkdtemp(prefix="tidegate-bench-"))
    server_port, sidecar_port = _port(), _port()
    procs = [
        _spawn(
            [binary, "-m", model, "--host", "127.0.0.1", "--port", str(server_port), "--ctx-size",
             str(1024 * args.slots), "--parallel", str(args.slots), "--threads", str(args.threads), "--metrics", "--slots"],
            work / "llama.log",
        )
    ]  # fmt: skip
    pool = InferencePool.model_validate({
        "metadata": {"name": "bench"},
        "spec": {"model": {"name": "smollm2", "engine": "llamacpp", "maxContextTokens": 1024},
                 "server": {"image": "llama.cpp"}, "admission": {"maxConcurrency": args.slots}},
    })  # fmt: skip
    config = work / "config.yaml"
    config.write_text(configmap.admission_config_map(pool)["data"][names.CONFIG_FILE])
    direct, sidecar = f"http://127.0.0.1:{server_port}", f"http://127.0.0.1:{sidecar_port}"
    try:
        _wait(direct + "/health")
        procs.append(
            _spawn(
                [sys.executable, "-m", "tidegate.cli.main", "admission", "--config", str(config), "--upstream",
                 direct, "--listen", f"127.0.0.1:{sidecar_port}", "--log-level", "WARNING"],
                work / "sidecar.log",
            )
        )  # fmt: skip
        _wait(sidecar + "/readyz")
        results: dict[tuple[str, int], list[float]] = {}
        for round_ in range(args.rounds):
            for concurrency in (1, args.slots):
                for name, url in (("direct", direct), ("sidecar", sidecar)):
                    try:
                        ttfts = asyncio.run(
                            _round(url, concurrency, args.requests, args.max_tokens, f"{name}-{round_}-{concurrency}")
                        )
                    except (OSError, AssertionError) as exc:
                        raise SystemExit(f"{name} at {concurrency} stream(s): {exc!r}; logs in {work}") from exc
                    results.setdefault((name, concurrency), []).extend(ttfts)
        print(f"llama-server --parallel {args.slots}, SmolLM2-135M Q4_1 on CPU; {args.rounds} rounds x "
              f"{args.requests} streamed chats, max_tokens {args.max_tokens}")  # fmt: skip
        print(f"{'target':<8} {'streams':>7} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'mean ms':>8}")
        for (name, concurrency), ttfts in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            print(f"{name:<8} {concurrency:>7} {_pct(ttfts, 0.5) * 1e3:>12.1f} {_pct(ttfts, 0.99) * 1e3:>12.1f} "
                  f"{statistics.mean(ttfts) * 1e3:>8.1f}")  # fmt: skip
        for concurrency in (1, args.slots):
            d, s = results[("direct", concurrency)], results[("sidecar", concurrency)]
            print(f"added by the sidecar at {concurrency} stream(s): p50 {(_pct(s, .5) - _pct(d, .5)) * 1e3:+.1f} ms, "
                  f"p99 {(_pct(s, .99) - _pct(d, .99)) * 1e3:+.1f} ms")  # fmt: skip
        print(json.dumps({f"{k[0]}@{k[1]}": round(_pct(v, 0.5) * 1e3, 2) for k, v in results.items()}))
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
