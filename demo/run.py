"""``tidegate demo``: the whole loop on this machine, no cluster.

Starts, all on 127.0.0.1 in this process: the real scaler's gRPC server
(:mod:`tidegate.scaler.server` over the sidecar signal source), the pool's pods (sim-backend +
real admission sidecar each, :mod:`tidegate.demo.pool`), the KEDA/HPA stand-in
(:mod:`tidegate.demo.keda`) and the load generator (:mod:`tidegate.demo.loadgen`). Runs the
scenario (:mod:`tidegate.demo.scenario`) for ``duration_s``, shows the live view, then stops
everything (clients drained, pods deleted, servers closed), writes the PNG and the timeline JSON
to ``out`` and prints the summary.

Loops (their periods): operator reconcile 0.2 s, KEDA poll ``poll_interval_s``, timeline sample
0.5 s, view refresh 0.5 s (with ``--no-live``: a plain line every 5 s).
"""

import asyncio
import contextlib
import dataclasses
import json
import logging
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import yaml
from rich.console import Console

from tidegate.demo import scenario, view
from tidegate.demo.keda import KedaStandIn
from tidegate.demo.loadgen import LoadGenerator
from tidegate.demo.pool import Pool
from tidegate.demo.timeline import Timeline
from tidegate.scaler import server as scaler_server
from tidegate.scaler.pods import StaticPodSource
from tidegate.scaler.service import Scaler
from tidegate.scaler.sidecar import SidecarSignals

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Result:
    """What a run produced: the timeline, the files written, and how long it took (wall seconds)."""

    timeline: Timeline
    png: Path | None
    timeline_json: Path
    config_file: Path
    wall_s: float
    addresses: list[str] = dataclasses.field(default_factory=list)  # every URL served during the run


async def _every(period_s: float, fn: Callable[[], Awaitable[None] | None]) -> None:
    while True:
        try:
            result = fn()
            if result is not None:
                await result
        except Exception:  # one failed pass must not stop the loop; say so
            log.exception("demo loop %s failed", getattr(fn, "__name__", fn))
        await asyncio.sleep(period_s)


async def run(settings: scenario.DemoSettings, console: Console) -> Result:
    """Run the demo; returns the :class:`Result`. Raises nothing for a bad run: the numbers tell."""
    started = time.monotonic()
    out = settings.out
    out.mkdir(parents=True, exist_ok=True)
    config_file = out / "admission.yaml"
    config_file.write_text(yaml.safe_dump(scenario.admission_config(settings), sort_keys=False), encoding="utf-8")
    timeline = Timeline()
    decisions: dict[str, str] = {}

    def on_decision(_target, decision) -> None:
        decisions["text"] = decision.text

    pod_source = StaticPodSource()
    scaler = Scaler(
        SidecarSignals(pod_source, timeout_s=1.0, stale_after_s=10.0), min_refresh_s=0.0, hooks=(on_decision,)
    )
    grpc_server, port = await scaler_server.start(scaler, "127.0.0.1:0")
    tasks: list[asyncio.Task[None]] = []
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    keda: KedaStandIn | None = None
    load: LoadGenerator | None = None
    t0 = time.monotonic()

    def clock() -> float:
        return time.monotonic() - t0

    with tempfile.TemporaryDirectory(prefix="tidegate-demo-") as workdir:
        pool = Pool(settings, config_file, Path(workdir), clock, timeline, pod_source, http)
        try:
            keda = KedaStandIn(f"127.0.0.1:{port}", settings, pool, timeline, clock, lambda: decisions.get("text", ""))
            load = LoadGenerator(
                scenario.arrivals(settings), pool.endpoints, timeline, clock, http, role_of=pool.role_of
            )
            await pool.start()
            t0 = time.monotonic()  # the scenario's clock starts with the pool in place
            timeline.replicas.append(pool.sample())
            await keda.setup()

            def sample() -> None:
                timeline.replicas.append(pool.sample())

            tasks = [
                asyncio.create_task(_every(0.2, pool.reconcile)),
                asyncio.create_task(_every(settings.poll_interval_s, keda.poll)),
                asyncio.create_task(_every(0.5, sample)),
            ]
            with view.LiveView(settings, timeline, pool, load, clock, console) as screen:
                tasks.append(asyncio.create_task(_every(0.5, screen.refresh)))
                await load.run()
                await asyncio.sleep(max(0.0, settings.duration_s - clock()))
                cancelled = await load.drain(timeout_s=10.0)
                if cancelled:
                    console.print(f"[yellow]{cancelled} request(s) still streaming at the end were cancelled[/]")
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if load is not None:
                await load.drain(timeout_s=0.0)
            if keda is not None:
                await keda.close()
            await pool.stop()
            await grpc_server.stop(grace=1.0)
            await scaler.close()
            await http.close()
    timeline_json = out / "timeline.json"
    timeline_json.write_text(json.dumps(_to_json(settings, timeline), indent=1), encoding="utf-8")
    png = view.write_plot(settings, timeline, out / "tidegate-demo.png", console)
    addresses = [*pool.addresses, f"http://127.0.0.1:{port}"]
    return Result(timeline, png, timeline_json, config_file, time.monotonic() - started, addresses)


def _to_json(settings: scenario.DemoSettings, timeline: Timeline) -> dict[str, object]:
    return {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(settings).items()},
        "phases": [dataclasses.asdict(p) for p in scenario.phases(settings)],
        "scale_events": [dataclasses.asdict(e) for e in timeline.scale_events],
        "promotions": [dataclasses.asdict(p) for p in timeline.promotions],
        "replicas": [dataclasses.asdict(r) for r in timeline.replicas],
        "outcomes": [dataclasses.asdict(o) for o in timeline.outcomes],
    }
