"""The kvstore process: core + servicer on the common server builder, lease expiry loop."""

from __future__ import annotations

import asyncio
import contextlib

from services.common.gen.dhisparse.v1 import kvstore_pb2_grpc
from services.common.logging import get_logger, setup_logging
from services.common.metrics import start_metrics_server
from services.common.server import create_server, serve_until_signal, write_port_file
from services.common.server import run as run_on_uvloop
from services.kvstore.config import KVStoreConfig
from services.kvstore.metrics import KVStoreMetrics
from services.kvstore.servicer import SERVICE_NAME, KVStoreServicer
from services.kvstore.store import KVStore

log = get_logger("kvstore")


async def _expire_forever(store: KVStore, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            store.expire()
        except Exception:  # a failing expiry must not stop the loop; it retries next tick
            log.exception("lease expiry failed")


async def run(config: KVStoreConfig, stop_event: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop_event``). Segments outlive the process."""
    store = KVStore(config.store_options())
    metrics = KVStoreMetrics(store)
    servicer = KVStoreServicer(store, metrics)
    handle = await create_server(
        config, register=lambda s: kvstore_pb2_grpc.add_KVStoreServicer_to_server(servicer, s),
        service_names=[SERVICE_NAME])
    metrics_server = start_metrics_server(config.metrics_port, metrics.registry, config.host)
    s = store.stats()
    log.info("kvstore ready", extra={"fields": {
        "port": handle.port, "capacity": s.capacity_bytes, "used": s.used_bytes,
        "recovered": s.recovered_histories, "prefix": config.prefix}})
    write_port_file(config.port_file, handle.port)
    expiry = asyncio.create_task(_expire_forever(store, config.expiry_interval_seconds))
    try:
        await serve_until_signal(handle, config, stop_event=stop_event)
    finally:
        expiry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expiry
        if metrics_server is not None:
            metrics_server.close()
        # off the loop: it may wait (up to its timeout) for opens still allocating
        await asyncio.to_thread(store.shutdown)


def main(config: KVStoreConfig) -> None:
    """Blocking entry point (``dhisparse kvstore``)."""
    setup_logging(config.log_level, config.log_json)
    run_on_uvloop(run(config))
