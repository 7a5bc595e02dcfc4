"""An in-process residency server on port 0 for service tests (real gRPC, loopback)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator

import grpc

from services.common.gen.dhisparse.v1 import residency_pb2 as pb
from services.common.gen.dhisparse.v1 import residency_pb2_grpc
from services.common.metrics import MetricsServer, start_metrics_server
from services.common.server import create_server
from services.residency.config import ResidencyConfig
from services.residency.controller import ResidencyController
from services.residency.metrics import ResidencyMetrics
from services.residency.servicer import SERVICE_NAME, ResidencyServicer, register


@dataclasses.dataclass
class Served:
    stub: residency_pb2_grpc.ResidencyStub
    controller: ResidencyController
    port: int
    metrics: MetricsServer | None

    def channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")

    async def state(self, requests: bool = True) -> pb.GetStateResponse:
        return await self.stub.GetState(pb.GetStateRequest(include_requests=requests))

    async def ledger(self) -> pb.GetStateResponse:
        """The state without its volatile fields (session liveness, report age)."""
        st = await self.state()
        for w in st.workers:
            w.last_seen_s, w.alive = 0.0, False
        return st


def hello(worker_id: str = "w0", capacity: int = 100, reserve: int = 10, slots: int = 8,
          requests: tuple[pb.RequestPages, ...] = ()) -> pb.RegisterWorkerRequest:
    return pb.RegisterWorkerRequest(worker_id=worker_id, address=f"{worker_id}:1",
                                    capacity_pages=capacity, reserve_pages=reserve,
                                    request_slots=slots, requests=list(requests))


@contextlib.asynccontextmanager
async def serving(metrics_port: int | None = None, **overrides: object) -> AsyncIterator[Served]:
    defaults: dict[str, object] = dict(port=0, heartbeat_timeout_seconds=30.0,
                                       tick_seconds=0.05, populate_inflight=0)
    config = ResidencyConfig(**{**defaults, **overrides})   # type: ignore[arg-type]
    metrics = ResidencyMetrics()
    controller = ResidencyController(config, metrics)
    await controller.start()
    servicer = ResidencyServicer(controller)
    handle = await create_server(config, register=lambda s: register(servicer, s),
                                 service_names=[SERVICE_NAME])
    http = start_metrics_server(metrics_port, metrics.registry, host="127.0.0.1")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}")
    try:
        yield Served(residency_pb2_grpc.ResidencyStub(channel), controller, handle.port, http)
    finally:
        await channel.close()
        await handle.stop(0)
        await controller.close()
        if http is not None:
            http.close()
