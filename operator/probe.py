"""Is the tidegate scaler answering? A gRPC health check (grpc.health.v1), cached briefly."""

import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


class ScalerProbe:
    """Callable ``probe(address) -> bool``: True when ``address`` answers SERVING within ``timeout_s``.

    Results are cached for ``ttl_s`` so a resync of many pools checks the scaler once.
    """

    def __init__(
        self,
        timeout_s: float = 1.0,
        ttl_s: float = 10.0,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self.credentials = credentials  # None: plaintext
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
            channel = (
                grpc.secure_channel(address, self.credentials)
                if self.credentials is not None
                else grpc.insecure_channel(address)
            )
            with channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=self.timeout_s
                )
            return reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False


def tls_credentials(ca_file: str | None, cert_file: str | None, key_file: str | None) -> grpc.ChannelCredentials:
    """TLS credentials for the probe: ``ca_file`` (None: system roots), and a client certificate
    and key for mTLS when both are given. Raises ``OSError`` when a file cannot be read."""

    def read(path: str | None) -> bytes | None:
        if not path:
            return None
        with open(path, "rb") as fh:
            return fh.read()

    return grpc.ssl_channel_credentials(
        root_certificates=read(ca_file), private_key=read(key_file), certificate_chain=read(cert_file)
    )
