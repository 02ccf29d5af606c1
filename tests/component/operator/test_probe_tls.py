"""The operator's scaler health probe against the real scaler over TLS and mTLS: with TLS on
and no working probe, the operator would never create a ScaledObject."""

import asyncio
import pathlib

import pytest

from tests.component.scaler.test_tls import pki  # noqa: F401 (the certificate fixture)
from tidegate.operator.probe import ScalerProbe, tls_credentials
from tidegate.scaler import server
from tidegate.scaler.pods import StaticPodSource
from tidegate.scaler.service import Scaler
from tidegate.scaler.sidecar import SidecarSignals


@pytest.mark.parametrize("mutual", [False, True])
async def test_probe_reaches_a_tls_scaler_only_with_the_right_credentials(pki: pathlib.Path, mutual: bool) -> None:  # noqa: F811
    tls = server.TLSFiles(str(pki / "server.crt"), str(pki / "server.key"), str(pki / "ca.crt") if mutual else None)
    scaler = Scaler(SidecarSignals(StaticPodSource()))
    grpc_server, port = await server.start(scaler, "127.0.0.1:0", tls)
    address = f"127.0.0.1:{port}"
    try:
        ca = str(pki / "ca.crt")
        with_cert = ScalerProbe(
            ttl_s=0, credentials=tls_credentials(ca, str(pki / "client.crt"), str(pki / "client.key"))
        )
        ca_only = ScalerProbe(ttl_s=0, credentials=tls_credentials(ca, None, None))
        plaintext = ScalerProbe(ttl_s=0)
        # The probe is synchronous (kopf runs handlers in threads): keep the server's loop free.
        assert await asyncio.to_thread(with_cert, address)
        assert await asyncio.to_thread(ca_only, address) is (not mutual)
        assert not await asyncio.to_thread(plaintext, address)
    finally:
        await grpc_server.stop(grace=None)
        await scaler.close()
