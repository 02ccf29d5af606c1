"""The scaler's HTTP side port: Prometheus ``/metrics`` and the last decisions as JSON.

- ``GET /metrics``: :mod:`tidegate.scaler.metrics` (``tidegate_scaler_desired_replicas{namespace,pool,reason}``);
- ``GET /decisions``: ``{"<namespace>/<pool>": decision, ...}`` for every pool this replica
  has decided; ``GET /decisions/{namespace}/{pool}``: one, or 404. A decision is
  ``{"current", "desired", "metricValue", "reason", "text", "active", "capacityRejectRate",
  "policyRejectRate", "utilization", "time"}`` (``time``: ISO 8601 UTC); ``text`` is the line an
  operator can post as an Event ("4 -> 8: capacity reject 31% across 5 tenants") and the shape
  matches the pool's ``status.signal``;
- ``GET /healthz``: 200.

Each replica answers for the decisions it made itself (KEDA's calls are spread over replicas), for
the pools it has not forgotten (:mod:`tidegate.scaler.service`).
"""

import datetime
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tidegate.scaler.law import Decision
from tidegate.scaler.metadata import Target
from tidegate.scaler.metrics import DesiredReplicasMetric


class DecisionLog:
    """The latest decision per pool, with the wall-clock time it was made (a ``Scaler`` hook)."""

    def __init__(self) -> None:
        self.latest: dict[str, dict[str, Any]] = {}

    def record(self, target: Target, d: Decision) -> None:
        self.latest[f"{target.namespace}/{target.pool}"] = {
            "current": d.current,
            "desired": d.desired,
            "metricValue": d.metric_value,
            "reason": d.reason.value,
            "text": d.text,
            "active": d.active,
            "capacityRejectRate": d.capacity_reject_rate,
            "policyRejectRate": d.policy_reject_rate,
            "utilization": d.utilization,
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }

    def forget(self, key: tuple[str, str]) -> None:
        """Drop pool ``key``'s entry (``(namespace, pool)``)."""
        self.latest.pop(f"{key[0]}/{key[1]}", None)


def app(metric: DesiredReplicasMetric, decisions: DecisionLog) -> web.Application:
    """The aiohttp application of the side port."""

    async def metrics(_: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(metric.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def all_decisions(_: web.Request) -> web.Response:
        return web.json_response(decisions.latest)

    async def one_decision(request: web.Request) -> web.Response:
        key = f"{request.match_info['namespace']}/{request.match_info['pool']}"
        if key not in decisions.latest:
            return web.json_response({"error": f"no decision for {key} on this replica yet"}, status=404)
        return web.json_response(decisions.latest[key])

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    application = web.Application()
    application.router.add_get("/metrics", metrics)
    application.router.add_get("/decisions", all_decisions)
    application.router.add_get("/decisions/{namespace}/{pool}", one_decision)
    application.router.add_get("/healthz", healthz)
    return application


async def start(metric: DesiredReplicasMetric, decisions: DecisionLog, host: str, port: int) -> web.AppRunner:
    """Serve the side port; returns the runner (``await runner.cleanup()`` to stop)."""
    runner = web.AppRunner(app(metric, decisions), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
