"""The decode process: worker + servicer on the common server builder."""

from __future__ import annotations

import asyncio

import torch

from services.common.logging import get_logger, setup_logging
from services.common.metrics import start_metrics_server
from services.common.server import create_server, serve_until_signal, write_port_file
from services.common.server import run as run_on_uvloop
from services.decode.config import DecodeConfig
from services.decode.metrics import DecodeMetrics
from services.decode.servicer import SERVICE_NAME, DecodeServicer, register
from services.decode.worker import DecodeWorker

log = get_logger("decode")
REGISTER_WAIT_S = 10.0


async def run(config: DecodeConfig, stop_event: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop_event``, or the engine failing)."""
    torch.set_num_threads(config.threads)
    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    metrics = DecodeMetrics(config.worker_id)
    worker = DecodeWorker(config, metrics,
                          on_fatal=lambda exc: loop.call_soon_threadsafe(stop.set))
    worker.start()
    if config.residency:     # serve once registered (or after a while: it keeps trying)
        await asyncio.to_thread(worker.admission.connected.wait, REGISTER_WAIT_S)
    handle = await create_server(config, register=lambda s: register(DecodeServicer(worker), s),
                                 service_names=[SERVICE_NAME])
    metrics_server = start_metrics_server(config.metrics_port, metrics.registry, config.host)
    log.info("decode ready", extra={"fields": {
        "port": handle.port, "worker": config.worker_id, "policy": config.policy,
        "preset": config.preset, "residency": config.residency, "kvstore": config.kvstore,
        "metrics_port": metrics_server.port if metrics_server else None}})
    write_port_file(config.port_file, handle.port)
    try:
        await serve_until_signal(handle, config, stop_event=stop)
    finally:
        await asyncio.to_thread(worker.close)
        if metrics_server is not None:
            metrics_server.close()
    if worker.failure is not None:
        raise SystemExit(1)


def main(config: DecodeConfig) -> None:
    """Blocking entry point (``dhisparse decode``)."""
    setup_logging(config.log_level, config.log_json)
    run_on_uvloop(run(config))
