"""The server builder every service uses: grpc.aio on uvloop, health, reflection,
interceptors, optional TLS and bearer token, graceful SIGTERM.

    async def main(config):
        server, port = await create_server(
            config, register=lambda s: add_KVStoreServicer_to_server(servicer, s),
            service_names=[KVSTORE_SERVICE])
        await serve_until_signal(server, config)

    run(main(config))          # installs uvloop, runs the coroutine
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common.config import ServiceConfig
from services.common.interceptors import ErrorInterceptor, TokenInterceptor
from services.common.logging import get_logger

log = get_logger("server")

T = TypeVar("T")

MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # one 4 MiB row chunk plus framing, with margin
SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
)


class ServerHandle:
    """A started server: its bound port and the health servicer to flip on shutdown."""

    def __init__(self, server: grpc.aio.Server, port: int, health_servicer: Any,
                 service_names: Sequence[str]) -> None:
        self.server = server
        self.port = port
        self.health = health_servicer
        self.service_names = list(service_names)

    async def set_serving(self, serving: bool) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def stop(self, grace: float) -> None:
        await self.set_serving(False)
        await self.server.stop(grace)


async def create_server(
    config: ServiceConfig,
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
) -> ServerHandle:
    """Build, bind and start a server; ``config.port == 0`` binds a free port."""
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if config.token:
        interceptors.append(TokenInterceptor(config.token))
    interceptors.append(ErrorInterceptor())
    server = grpc.aio.server(interceptors=interceptors, options=SERVER_OPTIONS)
    register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME], server)
    address = f"{config.host}:{config.port}"
    if config.tls_cert and config.tls_key:
        creds = grpc.ssl_server_credentials(
            [(Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())])
        port = server.add_secure_port(address, creds)
    else:
        port = server.add_insecure_port(address)
    await server.start()
    handle = ServerHandle(server, port, health_servicer, service_names)
    await handle.set_serving(True)
    log.info("serving", extra={"fields": {"address": f"{config.host}:{port}",
                                          "services": ",".join(service_names),
                                          "tls": bool(config.tls_cert),
                                          "token": bool(config.token)}})
    return handle


async def serve_until_signal(
    handle: ServerHandle,
    config: ServiceConfig,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    stop_event: asyncio.Event | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop_event``), then drain gracefully."""
    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    await stop.wait()
    log.info("stopping", extra={"fields": {"grace_s": config.grace_seconds}})
    if on_stop is not None:
        await on_stop()
    await handle.stop(config.grace_seconds)


def write_port_file(path: str | None, port: int) -> None:
    """Atomically write the bound port (tests and supervisors read it)."""
    if not path:
        return
    target = Path(path)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(f"{port}\n")
    tmp.replace(target)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run a service's main coroutine on uvloop (falls back to asyncio without it)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a runtime dependency
        return asyncio.run(main)
    return uvloop.run(main)


def channel_credentials(config: ServiceConfig, ca_cert: str | None = None) -> Any:
    """Client credentials matching a server config (None = insecure)."""
    if not (config.tls_cert or ca_cert):
        return None
    root = Path(ca_cert or config.tls_cert).read_bytes()  # type: ignore[arg-type]
    return grpc.ssl_channel_credentials(root_certificates=root)
