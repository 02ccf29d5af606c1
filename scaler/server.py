"""The gRPC edge: KEDA's ``externalscaler.ExternalScaler`` plus ``grpc.health.v1.Health``.

- ``GetMetricSpec``: static, from the trigger metadata alone (never touches a backend, so a slow
  pool cannot make KEDA's HPA setup fail): one metric, ``tidegate-<pool>-desired-replicas``,
  AverageValue target 1 (``targetSize`` 1 and ``targetSizeFloat`` 1.0).
- ``GetMetrics``: the law's desired replicas for the pool (``metricValue`` and
  ``metricValueFloat``; see :func:`tidegate.scaler.law.hpa_metric_value` for why it can exceed
  ``desired`` by the HPA's tolerance).
- ``IsActive``: demand, queued or refused requests, replicas starting, or data we cannot trust.
- ``StreamIsActive``: the same answer, sent at once and then whenever it changes (checked every
  ``stream_interval_s``); a failed read is sent as ``true`` (KEDA acts only on pushed ``true``).

Errors are translated here and only here (:func:`_status`): metadata -> INVALID_ARGUMENT naming
the key, unknown metric -> NOT_FOUND, unreadable signal -> UNAVAILABLE (KEDA counts it toward its
``fallback``), anything else -> INTERNAL.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tidegate.scaler import errors, metadata
from tidegate.scaler.proto import externalscaler_pb2 as pb
from tidegate.scaler.proto import externalscaler_pb2_grpc as pb_grpc
from tidegate.scaler.service import Scaler

log = logging.getLogger("tidegate.scaler")
SERVICE_NAME = "externalscaler.ExternalScaler"
T = TypeVar("T")


def _status(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The one error -> gRPC status mapping of the scaler."""
    if isinstance(exc, errors.MetadataError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, errors.UnknownMetricError):
        return grpc.StatusCode.NOT_FOUND, str(exc)
    if isinstance(exc, errors.SourceError):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def _target(ref: pb.ScaledObjectRef) -> metadata.Target:
    return metadata.parse(ref.name, ref.namespace, dict(ref.scalerMetadata))


class ExternalScalerServicer(pb_grpc.ExternalScalerServicer):
    """KEDA's ExternalScaler service over a :class:`~tidegate.scaler.service.Scaler`."""

    def __init__(self, scaler: Scaler, stream_interval_s: float = 5.0) -> None:
        self.scaler = scaler
        self.stream_interval_s = stream_interval_s

    async def _call(self, context: grpc.aio.ServicerContext, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            return await fn()
        except Exception as exc:
            code, details = _status(exc)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("scaler call failed")
            await context.abort(code, details)
            raise  # unreachable: abort raises

    async def GetMetricSpec(self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext):
        async def run() -> pb.GetMetricSpecResponse:
            target = _target(request)
            spec = pb.MetricSpec(metricName=target.metric_name, targetSize=1, targetSizeFloat=1.0)
            return pb.GetMetricSpecResponse(metricSpecs=[spec])

        return await self._call(context, run)

    async def GetMetrics(self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext):
        async def run() -> pb.GetMetricsResponse:
            target = _target(request.scaledObjectRef)
            target.check_metric_name(request.metricName)
            decision = await self.scaler.decide(target)
            value = pb.MetricValue(
                metricName=target.metric_name,
                metricValue=round(decision.metric_value),
                metricValueFloat=decision.metric_value,
            )
            return pb.GetMetricsResponse(metricValues=[value])

        return await self._call(context, run)

    async def IsActive(self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext):
        async def run() -> pb.IsActiveResponse:
            decision = await self.scaler.decide(_target(request))
            return pb.IsActiveResponse(result=decision.active)

        return await self._call(context, run)

    async def StreamIsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.IsActiveResponse]:
        async def parse() -> metadata.Target:
            return _target(request)

        target = await self._call(context, parse)
        last: bool | None = None
        while True:
            try:
                active = (await self.scaler.decide(target)).active
            except errors.SourceError as exc:
                log.warning("StreamIsActive %s/%s: %s; reporting active", target.namespace, target.pool, exc)
                active = True  # cannot tell: never let KEDA scale the pool to zero on a blind spot
            if active != last:
                yield pb.IsActiveResponse(result=active)
                last = active
            await asyncio.sleep(self.stream_interval_s)


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for the server: ``cert``/``key``; with ``client_ca``, clients must present a cert it signed (mTLS).

    On KEDA's side the matching TriggerAuthentication carries ``caCert`` (and for mTLS
    ``tlsClientCert``/``tlsClientKey``) as PEM text, and the trigger sets ``enableTLS: "true"``.
    """

    cert: str
    key: str
    client_ca: str | None = None

    def credentials(self) -> grpc.ServerCredentials:
        def read(path: str) -> bytes:
            with open(path, "rb") as fh:
                return fh.read()

        ca = read(self.client_ca) if self.client_ca else None
        return grpc.ssl_server_credentials(
            [(read(self.key), read(self.cert))], root_certificates=ca, require_client_auth=ca is not None
        )


async def start(scaler: Scaler, listen: str, tls: TLSFiles | None = None, stream_interval_s: float = 5.0):
    """Start the server on ``listen`` (``HOST:PORT``; port 0 picks one). Returns ``(server, port)``.

    Raises RuntimeError when the address cannot be bound.
    """
    server = grpc.aio.server()
    pb_grpc.add_ExternalScalerServicer_to_server(ExternalScalerServicer(scaler, stream_interval_s), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_secure_port(listen, tls.credentials()) if tls else server.add_insecure_port(listen)
    if port == 0 and not listen.endswith(":0"):
        raise RuntimeError(f"cannot listen on {listen}")
    await server.start()
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    return server, port
