"""The server builder's optional TLS: a TLS client gets through, a plaintext one does not."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.config import ServiceConfig
from services.common.server import channel_credentials, create_server

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("tls")
    key, crt = d / "key.pem", d / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True)
    return str(crt), str(key)


def test_tls_server_serves_tls_clients_only(cert) -> None:
    crt, key = cert

    async def scenario() -> None:
        cfg = ServiceConfig(port=0, tls_cert=crt, tls_key=key)
        handle = await create_server(cfg, register=lambda s: None, service_names=[])
        target = f"localhost:{handle.port}"
        request = health_pb2.HealthCheckRequest(service="")
        async with grpc.aio.secure_channel(target, channel_credentials(cfg)) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(request, timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        async with grpc.aio.insecure_channel(target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await health_pb2_grpc.HealthStub(channel).Check(request, timeout=2)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        await handle.stop(0)

    asyncio.run(scenario())
