"""TLS and mutual TLS, as a KEDA TriggerAuthentication (caCert, tlsClientCert, tlsClientKey) would connect."""

import pathlib
import shutil
import subprocess

import grpc
import pytest

from tidegate.scaler import server
from tidegate.scaler.pods import StaticPodSource
from tidegate.scaler.proto import externalscaler_pb2 as pb
from tidegate.scaler.proto import externalscaler_pb2_grpc as pb_grpc
from tidegate.scaler.service import Scaler
from tidegate.scaler.sidecar import SidecarSignals

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "1", "-subj", "/CN=tidegate-test-ca", cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "1", "-extfile", "san.ext", cwd=d)  # fmt: skip
    return d


async def _spec(port: int, creds: grpc.ChannelCredentials) -> pb.GetMetricSpecResponse:
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as channel:
        ref = pb.ScaledObjectRef(name="small", namespace="ns", scalerMetadata={"pool": "small"})
        return await pb_grpc.ExternalScalerStub(channel).GetMetricSpec(ref, timeout=5)


@pytest.mark.parametrize("mutual", [False, True])
async def test_tls_clients_connect_and_mtls_refuses_clients_without_a_cert(pki: pathlib.Path, mutual: bool) -> None:
    tls = server.TLSFiles(str(pki / "server.crt"), str(pki / "server.key"), str(pki / "ca.crt") if mutual else None)
    scaler = Scaler(SidecarSignals(StaticPodSource()))
    grpc_server, port = await server.start(scaler, "127.0.0.1:0", tls)
    ca = (pki / "ca.crt").read_bytes()
    try:
        with_cert = grpc.ssl_channel_credentials(
            ca, (pki / "client.key").read_bytes(), (pki / "client.crt").read_bytes()
        )
        assert (await _spec(port, with_cert)).metricSpecs[0].targetSizeFloat == 1.0
        without_cert = grpc.ssl_channel_credentials(ca)
        if mutual:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _spec(port, without_cert)
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        else:
            assert (await _spec(port, without_cert)).metricSpecs
    finally:
        await grpc_server.stop(grace=None)
        await scaler.close()
