"""The gRPC shell of the residency controller: protobuf → controller → protobuf.

Domain errors propagate to ``services.common.interceptors.ErrorInterceptor``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from services.common.errors import InvalidArgument
from services.common.gen.dhisparse.v1 import residency_pb2 as pb
from services.common.gen.dhisparse.v1 import residency_pb2_grpc
from services.residency.controller import ResidencyController, WorkerSession
from services.residency.core import AdmitSpec, Command, RequestEntry, RequestReport, WorkerSpec

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Residency"].full_name


def worker_spec(msg: pb.RegisterWorkerRequest, default_slots: int) -> WorkerSpec:
    return WorkerSpec(msg.worker_id, msg.capacity_pages, msg.reserve_pages,
                      msg.request_slots or default_slots, msg.address)


def reports(msg: pb.RegisterWorkerRequest) -> list[RequestReport]:
    return [RequestReport(r.request_id, r.required_pages, r.history_pages, r.ready_pages,
                          r.backed_pages) for r in msg.requests]


def command_pb(cmd: Command) -> pb.WorkerCommand:
    kind = {cmd.kind.value: getattr(pb, cmd.kind.value.capitalize())(pages=cmd.pages)}
    return pb.WorkerCommand(command_id=cmd.command_id, request_id=cmd.request_id, **kind)


def request_pb(e: RequestEntry, pending: str) -> pb.RequestPages:
    return pb.RequestPages(request_id=e.request_id, required_pages=e.required,
                           optional_pages=e.allocated, ready_pages=e.ready,
                           history_pages=e.history, backed_pages=e.backed, pending=pending,
                           reclaiming=e.retire_pages > 0)


class ResidencyServicer(residency_pb2_grpc.ResidencyServicer):
    def __init__(self, controller: ResidencyController) -> None:
        self.controller = controller

    async def RegisterWorker(self, request: pb.RegisterWorkerRequest,
                             context: grpc.aio.ServicerContext) -> pb.RegisterWorkerResponse:
        c = self.controller
        adopted = c.register(worker_spec(request, c.config.request_slots), reports(request))
        return pb.RegisterWorkerResponse(worker_id=request.worker_id, epoch=c.epoch,
                                         heartbeat_timeout_s=c.config.heartbeat_timeout_seconds,
                                         adopted_requests=adopted)

    async def Admit(self, request: pb.AdmitRequest,
                    context: grpc.aio.ServicerContext) -> pb.AdmitResponse:
        spec = AdmitSpec(request.request_id, request.required_pages, request.history_pages,
                         request.worker_id)
        g = await self.controller.admit(spec, context.time_remaining())
        return pb.AdmitResponse(request_id=g.request_id, worker_id=g.worker_id,
                                worker_address=g.address, required_pages=g.required_pages,
                                optional_pages=g.optional_pages, wait_seconds=g.waited_s,
                                reclaimed_requests=list(g.reclaimed))

    async def Release(self, request: pb.ReleaseRequest,
                      context: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        return pb.ReleaseResponse(
            freed_pages=self.controller.release(request.request_id, request.worker_id))

    async def Session(self, request_iterator: AsyncIterator[pb.WorkerReport],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WorkerCommand]:
        c = self.controller
        first = await anext(aiter(request_iterator), None)
        if first is None or not first.HasField("hello"):
            raise InvalidArgument("Session: the first WorkerReport must carry a hello "
                                  "(the worker's RegisterWorkerRequest)")
        session = c.open_session(worker_spec(first.hello, c.config.request_slots),
                                 reports(first.hello))
        reader = asyncio.create_task(self._read(request_iterator, session))
        try:
            while (cmd := await session.next()) is not None:
                yield command_pb(cmd)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            c.close_session(session)

    async def _read(self, it: AsyncIterator[pb.WorkerReport], session: WorkerSession) -> None:
        try:
            async for msg in it:
                self.controller.report(session, [(a.command_id, a.ok) for a in msg.acks],
                                       list(msg.released))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            session.close(exc)
            return
        session.close()

    async def GetState(self, request: pb.GetStateRequest,
                       context: grpc.aio.ServicerContext) -> pb.GetStateResponse:
        c, core = self.controller, self.controller.core
        if request.worker_id:
            core.worker(request.worker_id)   # NotFound for an unknown worker
        now = c.core_clock()
        workers = []
        for wid, w in sorted(core.workers.items()):
            if request.worker_id and wid != request.worker_id:
                continue
            reqs = [request_pb(e, core.commands[e.pending].kind.value
                               if e.pending is not None else "")
                    for e in w.requests.values()] if request.include_requests else []
            workers.append(pb.WorkerState(
                worker_id=wid, address=w.spec.address, capacity_pages=w.spec.capacity_pages,
                reserve_pages=w.spec.reserve_pages, required_pages=w.required,
                optional_pages=w.allocated, free_pages=w.free_pages,
                request_slots=w.spec.request_slots, allocated_slots=len(w.requests),
                coverage=w.coverage, requests=reqs, alive=c.alive(wid), ready_pages=w.ready,
                history_pages=w.history, reclaimed_pages_total=w.reclaimed_total,
                populated_pages_total=w.populated_total, last_seen_s=now - w.last_seen))
        return pb.GetStateResponse(workers=workers, waiting_admissions=len(core.waiting),
                                   policy=core.config.policy.value,
                                   reclaim_order=core.config.reclaim_order.value,
                                   epoch=c.epoch)


def register(servicer: ResidencyServicer, server: Any) -> None:
    residency_pb2_grpc.add_ResidencyServicer_to_server(servicer, server)
