"""Is the tidegate scaler answering? A gRPC health check (grpc.health.v1), cached briefly."""

import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


class ScalerProbe:
    """Callable ``probe(address) -> bool``: True when ``address`` answers SERVING within ``timeout_s``.

    Results are cached for ``ttl_s`` so a resync of many pools checks the scaler once.
    """

    def __init__(self, timeout_s: float = 1.0, ttl_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def __call__(self, address: str) -> bool:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(address)
            if hit and now - hit[0] < self.ttl_s:
                return hit[1]
        ok = self._check(address)
        with self._lock:
            self._cache[address] = (now, ok)
        return ok

    def _check(self, address: str) -> bool:
        try:
            with grpc.insecure_channel(address) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=self.timeout_s
                )
            return reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False
