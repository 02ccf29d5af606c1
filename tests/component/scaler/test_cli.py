"""`tidegate scaler` as a process: serves on --listen, reads static pods, exports its metric and
last decision, stops on SIGTERM."""

import asyncio
import json
import pathlib
import signal
import socket
import sys
import time
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidegate.admission.stats import FakeSidecar, StatsSnapshot
from tidegate.scaler.proto import externalscaler_pb2 as pb
from tidegate.scaler.proto import externalscaler_pb2_grpc as pb_grpc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _wait_serving(channel: grpc.aio.Channel, deadline_s: float) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    while True:
        try:
            resp = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            if resp.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline_s:
                raise
        await asyncio.sleep(0.1)


async def test_scaler_process_serves_and_stops_cleanly(tmp_path: pathlib.Path) -> None:
    now = time.time()
    snapshot = StatsSnapshot(instance_id="a", started_at_s=now - 3600, time_s=now, token_budget=1000)
    async with FakeSidecar(snapshot) as fake:
        pods = tmp_path / "pods.json"
        pods.write_text(json.dumps({"ns/small": [{"name": "small-0", "url": fake.url}]}))
        port, metrics_port = _free_port(), _free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tidegate.cli.main", "scaler", "--listen", f"127.0.0.1:{port}",
            "--pods", str(pods), "--metrics-port", str(metrics_port), "--log-level", "WARNING",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await _wait_serving(channel, time.monotonic() + 30)
                ref = pb.ScaledObjectRef(name="small", namespace="ns", scalerMetadata={"pool": "small"})
                resp = await pb_grpc.ExternalScalerStub(channel).GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref))
                assert resp.metricValues[0].metricValueFloat == 1.0  # one pod, first sample: hold at 1
            body = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
            )
            assert 'tidegate_scaler_desired_replicas{namespace="ns",pool="small",reason="hold_warmup"} 1.0' in body
            decision = await asyncio.to_thread(
                lambda: json.load(
                    urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/decisions/ns/small", timeout=5)
                )
            )
            assert decision["text"] == "1 -> 1: holding: first sample" and decision["active"] is True
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, stderr.decode()


def test_static_pods_with_a_flag_that_is_not_a_boolean_are_refused_by_name(tmp_path: pathlib.Path) -> None:
    """``"serving": "false"`` in a static pods file is a truthy string: the scaler counted the warm pod's
    load and budget as serving (and ``"ready": "false"`` as Ready) and served on; now it exits naming
    the field (before: it served, so this timed out)."""
    import subprocess

    pods = tmp_path / "pods.json"
    pods.write_text(
        json.dumps({"ns/small": [{"name": "w-0", "url": "http://127.0.0.1:1", "role": "warm", "serving": "false"}]})
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tidegate.cli.main", "scaler", "--listen", f"127.0.0.1:{_free_port()}",
         "--pods", str(pods), "--metrics-port", "0"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "'w-0': serving must be true or false, not 'false'" in proc.stderr
