"""What the sidecar reads from the model server, as a user of vLLM or llama.cpp would notice it:
a gzipped metrics page, llama.cpp's deferred queue holding new work, signals that cannot be read
made loud, and the pool's ``server.metricsPath`` / ``healthPath`` honoured."""

import asyncio
import gzip
import logging
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from tidegate.admission.engine import EngineTuning

from .helpers import chat, error_of, eventually

# llama-server's answer on /metrics without --metrics (tools/server/server-context.cpp, llama.cpp 0c1e570)
NO_METRICS = {
    "error": {
        "code": 501,
        "message": "This server does not support metrics endpoint. Start it with `--metrics`",
        "type": "not_supported_error",
    }
}
NO_SLOTS = {
    "error": {
        "code": 501,
        "message": "This server does not support slots endpoint. Start it with `--slots`",
        "type": "not_supported_error",
    }
}


class FakeLlamaServer:
    """llama-server's telemetry routes over loopback, with switches: ``metrics`` (False: 501 as
    without ``--metrics``; or a ``(content_type, headers, body)`` override), ``deferred`` /
    ``processing``, ``slots`` (False: ``--no-slots``), ``health`` status. Answers chats at once."""

    def __init__(self, metrics_path: str = "/metrics", health_path: str = "/health") -> None:
        self.metrics: bool | tuple[str, dict[str, str], bytes] = True
        self.deferred, self.processing, self.predicted = 0, 0, 0
        self.slots, self.health = True, 200
        self.metrics_path, self.health_path = metrics_path, health_path
        self.runner: web.AppRunner | None = None
        self.url = ""

    def page(self) -> str:
        gauges = {"requests_processing": self.processing, "requests_deferred": self.deferred}
        lines = ["# TYPE llamacpp:n_decode_total counter", f"llamacpp:n_decode_total {self.predicted}"]
        for name, value in gauges.items():
            lines += [f"# TYPE llamacpp:{name} gauge", f"llamacpp:{name} {value}"]
        return "\n".join(lines) + "\n"

    async def _metrics(self, _request: web.Request) -> web.Response:
        if self.metrics is False:
            return web.json_response(NO_METRICS, status=501)
        if isinstance(self.metrics, tuple):
            content_type, headers, body = self.metrics
            return web.Response(body=body, headers={"Content-Type": content_type, **headers})
        return web.Response(text=self.page(), content_type="text/plain")

    async def _slots(self, _request: web.Request) -> web.Response:
        if not self.slots:
            return web.json_response(NO_SLOTS, status=501)
        return web.json_response([{"id": i, "n_ctx": 1024, "is_processing": False} for i in range(2)])

    async def _props(self, _request: web.Request) -> web.Response:
        return web.json_response({"total_slots": 2, "default_generation_settings": {"n_ctx": 1024, "params": {}}})

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok" if self.health == 200 else "loading"}, status=self.health)

    async def _chat(self, _request: web.Request) -> web.Response:
        self.predicted += 2
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        choice = {"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "hi"}}
        return web.json_response({"object": "chat.completion", "choices": [choice], "usage": usage})

    async def __aenter__(self) -> "FakeLlamaServer":
        app = web.Application()
        app.router.add_get(self.metrics_path, self._metrics)
        app.router.add_get(self.health_path, self._health)
        app.router.add_get("/slots", self._slots)
        app.router.add_get("/props", self._props)
        app.router.add_post("/v1/chat/completions", self._chat)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def sample(text: str, name: str, **labels: str) -> float | None:
    """One sample of the sidecar's /metrics page (labels matched as given)."""
    for line in text.splitlines():
        named = line.startswith(name + "{") or line.startswith(name + " ")
        if named and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def stats(http: aiohttp.ClientSession, sidecar: Any) -> dict[str, Any]:
    async with http.get(sidecar.url + "/tidegate/stats") as resp:
        assert resp.status == 200
        return await resp.json()


async def test_kv_pressure_is_read_from_a_backend_that_gzips_its_metrics(start_sim, start_sidecar, http) -> None:
    """vLLM serves /metrics gzipped to any client that accepts gzip; the KV gate must still see 95 %."""
    sim = await start_sim()
    async with aiohttp.ClientSession(auto_decompress=False) as raw, raw.get(sim.url + "/metrics") as resp:
        assert resp.headers.get("Content-Encoding") == "gzip"  # what the sidecar gets, as from vLLM
        assert b"vllm:kv_cache_usage_perc" in gzip.decompress(await resp.read())
    sidecar = await start_sidecar(sim.url)
    async with http.post(sim.url + "/sim/faults", json={"freeze_metrics": {"kv_cache_usage_perc": 0.95}}) as r:
        assert r.status == 200
    await eventually(lambda: sidecar.engine.kv.value == 0.95, what="the sidecar read 95% KV usage")
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 503, await resp.text()
        assert error_of(await resp.json())["code"] == "kv_pressure"
        assert int(resp.headers["Retry-After"]) >= 1
    doc = await stats(http, sidecar)
    assert doc["telemetry_ok"] is True and doc["telemetry_error"] is None
    assert doc["backend_kv_capacity_tokens"] == sim.settings.replica.kv_capacity_tokens
    assert doc["backend_requests_queued"] == 0


async def test_llamacpp_deferred_requests_hold_new_work_in_the_sidecar_queue(start_sidecar, http) -> None:
    """While llama-server defers requests (all slots busy), new work waits in the sidecar's fair queue,
    runs once the deferred queue is empty, and is refused with Retry-After when it stays full."""
    async with FakeLlamaServer() as llama:
        sidecar = await start_sidecar(
            llama.url, model={"engine": "llamacpp", "maxContextTokens": 1024},
            admission={"telemetry": {"pollIntervalMs": 50}, "queue": {"maxWaitMs": 400}},
            tuning=EngineTuning(frozen_after_s=60.0, prior_duration_s=0.2),
        )  # fmt: skip
        await eventually(lambda: sidecar.engine.backend_capacity is not None, what="slots read")
        async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
            assert resp.status == 200
        llama.processing, llama.deferred = 2, 2
        await eventually(lambda: sidecar.engine.backend_queue.value == 2, what="the deferred queue read")
        waiting = asyncio.ensure_future(http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)))
        await eventually(lambda: sidecar.engine.queue.depth == 1, what="the request held in the sidecar's queue")
        doc = await stats(http, sidecar)
        assert doc["backend_queue_held"] is True and doc["backend_requests_queued"] == 2
        assert (doc["backend_slots"], doc["backend_context_tokens"]) == (2, 1024)
        assert doc["telemetry_ok"] is True and 0 <= doc["telemetry_age_s"] < 1.0
        llama.processing, llama.deferred = 1, 0
        async with await waiting as resp:
            assert resp.status == 200  # dispatched once the engine's queue emptied
        llama.processing, llama.deferred = 2, 1
        await eventually(lambda: sidecar.engine.backend_queue.value == 1, what="the deferred queue read")
        async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
            assert resp.status == 503
            assert error_of(await resp.json())["code"] == "queue_timeout"
            assert int(resp.headers["Retry-After"]) >= 1
        assert llama.predicted == 4  # the refused request never reached the engine


@pytest.mark.parametrize(
    ("metrics", "kind", "said"),
    [
        (False, "http_status", "Start it with `--metrics`"),
        (("text/plain", {"Content-Encoding": "gzip"}, b"not gzip at all"), "undecodable", "not decodable"),
        (("text/html", {}, b"<html><body>login</body></html>"), "unparsable", "GET /metrics"),
        (("text/plain", {}, b"process_cpu_seconds_total 1.0\n"), "metric_missing", "llamacpp:requests_deferred"),
    ],
    ids=["no-metrics-flag", "bad-gzip", "html", "other-exporter"],
)
async def test_metrics_that_cannot_be_read_are_loud_and_recovery_is_noticed(
    start_sidecar, http, caplog, metrics: object, kind: str, said: str
) -> None:
    caplog.set_level(logging.INFO, logger="tidegate.admission.poller")
    async with FakeLlamaServer() as llama:
        llama.metrics = metrics  # type: ignore[assignment]
        sidecar = await start_sidecar(llama.url, model={"engine": "llamacpp", "maxContextTokens": 1024})
        await eventually(lambda: sidecar.metrics.telemetry_errors.labels("test", "metrics", kind)._value.get() >= 3,
                         what="three failed polls")  # fmt: skip
        doc = await stats(http, sidecar)
        assert doc["telemetry_ok"] is False and said in doc["telemetry_error"], doc["telemetry_error"]
        assert doc["telemetry_age_s"] is None and doc["backend_requests_queued"] is None
        async with http.get(sidecar.url + "/metrics") as resp:
            page = await resp.text()
        assert sample(page, "tidegate_admission_telemetry_errors_total", source="metrics", kind=kind) >= 3
        assert sample(page, "tidegate_admission_telemetry_up", pool="test") == 0
        async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
            assert resp.status == 200  # onStale failOpen (the default): served on its token budget
        llama.metrics = True
        await eventually(lambda: sidecar.poller.episodes.ok, what="the metrics read again")
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name.endswith("poller")]
        assert len(warnings) == 1 and said in warnings[0], warnings  # once per episode, not per poll
        assert any("backend metrics read again" in r.getMessage() for r in caplog.records if r.levelname == "INFO")
        assert (await stats(http, sidecar))["telemetry_ok"] is True


async def test_failclosed_holds_new_work_when_the_metrics_never_arrive(start_sidecar, http) -> None:
    """llama-server without --metrics under ``onStale: failClosed``: once the signal is overdue,
    nothing new reaches the engine; clients are refused with Retry-After instead."""
    async with FakeLlamaServer() as llama:
        llama.metrics = False
        telemetry = {"pollIntervalMs": 50, "staleAfterSeconds": 0.3, "onStale": "failClosed"}
        sidecar = await start_sidecar(
            llama.url, model={"engine": "llamacpp", "maxContextTokens": 1024},
            admission={"telemetry": telemetry, "queue": {"maxWaitMs": 300}},
            tuning=EngineTuning(prior_duration_s=0.1),
        )  # fmt: skip
        await eventually(lambda: sidecar.engine.backend_queue_held, what="the overdue signal to hold dispatch")
        async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
            assert resp.status == 503
            assert error_of(await resp.json())["code"] == "queue_timeout"
            assert int(resp.headers["Retry-After"]) >= 1
        assert llama.predicted == 0


async def test_slots_disabled_reads_slot_capacity_from_props(start_sidecar, http, caplog) -> None:
    caplog.set_level(logging.INFO, logger="tidegate.admission.poller")
    async with FakeLlamaServer() as llama:
        llama.slots = False  # llama-server --no-slots
        sidecar = await start_sidecar(llama.url, model={"engine": "llamacpp", "maxContextTokens": 1024})
        await eventually(lambda: sidecar.engine.backend_capacity is not None, what="capacity read")
        doc = await stats(http, sidecar)
        assert (doc["backend_slots"], doc["backend_context_tokens"]) == (2, 1024)
        assert doc["telemetry_ok"] is True
        assert any("GET /props" in r.getMessage() and "--slots" in r.getMessage() for r in caplog.records)


async def test_the_pools_metrics_and_health_paths_are_the_ones_read(start_sidecar, http, tmp_path) -> None:
    async with FakeLlamaServer(metrics_path="/stats/prometheus", health_path="/ready") as llama:
        llama.deferred, llama.health = 3, 503  # loading
        manifest = {
            "apiVersion": "tidegate.dev/v1alpha1", "kind": "InferencePool", "metadata": {"name": "test"},
            "spec": {
                "model": {"name": "m", "engine": "llamacpp", "maxContextTokens": 1024},
                "server": {"image": "llama", "metricsPath": "/stats/prometheus", "healthPath": "/ready"},
                "admission": {"telemetry": {"pollIntervalMs": 50}},
            },
        }  # fmt: skip
        path = tmp_path / "pool.yaml"
        path.write_text(yaml.safe_dump(manifest))
        sidecar = await start_sidecar(llama.url, config_path=str(path))
        await eventually(lambda: not sidecar.backend_healthy, what="the health path read")
        async with http.get(sidecar.url + "/readyz") as resp:
            assert resp.status == 503 and (await resp.json())["backend_healthy"] is False
        llama.health = 200
        await eventually(lambda: sidecar.engine.backend_queue.value == 3, what="the metrics path read")
        async with http.get(sidecar.url + "/readyz") as resp:
            assert resp.status == 200
        assert (await stats(http, sidecar))["telemetry_ok"] is True
