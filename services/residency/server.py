"""The residency process: controller + servicer on the common server builder."""

from __future__ import annotations

import asyncio

from services.common.logging import get_logger, setup_logging
from services.common.metrics import start_metrics_server
from services.common.server import create_server, serve_until_signal, write_port_file
from services.common.server import run as run_on_uvloop
from services.residency.config import ResidencyConfig
from services.residency.controller import ResidencyController
from services.residency.metrics import ResidencyMetrics
from services.residency.servicer import SERVICE_NAME, ResidencyServicer, register

log = get_logger("residency")


async def run(config: ResidencyConfig, stop_event: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop_event``). State is soft: nothing to save."""
    metrics = ResidencyMetrics()
    controller = ResidencyController(config, metrics)
    servicer = ResidencyServicer(controller)
    await controller.start()
    handle = await create_server(config, register=lambda s: register(servicer, s),
                                 service_names=[SERVICE_NAME])
    metrics_server = start_metrics_server(config.metrics_port, metrics.registry, config.host)
    log.info("residency ready", extra={"fields": {
        "port": handle.port, "policy": config.policy, "reclaim_order": config.reclaim_order,
        "epoch": controller.epoch,
        "metrics_port": metrics_server.port if metrics_server else None}})
    write_port_file(config.port_file, handle.port)
    try:
        await serve_until_signal(handle, config, on_stop=controller.close,
                                 stop_event=stop_event)
    finally:
        await controller.close()
        if metrics_server is not None:
            metrics_server.close()


def main(config: ResidencyConfig) -> None:
    """Blocking entry point (``dhisparse residency``)."""
    setup_logging(config.log_level, config.log_json)
    run_on_uvloop(run(config))
