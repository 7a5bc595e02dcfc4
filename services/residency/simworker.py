"""A simulated decode worker for tests, benchmarks and demos: it opens a Session, keeps
a local view of its requests' pages, acknowledges commands (after ``ack_delay_s``, or
only when told, with ``auto_ack=False``) and sends heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from services.common.gen.dhisparse.v1 import residency_pb2 as pb
from services.common.gen.dhisparse.v1 import residency_pb2_grpc


class SimulatedWorker:
    def __init__(self, stub: residency_pb2_grpc.ResidencyStub, hello: pb.RegisterWorkerRequest,
                 heartbeat_s: float = 0.5, ack_delay_s: float = 0.0,
                 auto_ack: bool = True) -> None:
        self.stub, self.hello = stub, hello
        self.heartbeat_s, self.ack_delay_s, self.auto_ack = heartbeat_s, ack_delay_s, auto_ack
        self.received: list[pb.WorkerCommand] = []
        self.error: grpc.RpcError | None = None
        self._out: asyncio.Queue[pb.WorkerReport | None] = asyncio.Queue()
        self._call: grpc.aio.StreamStreamCall | None = None
        self._reader: asyncio.Task[None] | None = None
        self._arrived = asyncio.Event()

    @property
    def worker_id(self) -> str:
        return self.hello.worker_id

    async def start(self) -> None:
        self._call = self.stub.Session(self._reports())
        self._reader = asyncio.create_task(self._read())

    async def _reports(self) -> AsyncIterator[pb.WorkerReport]:
        yield pb.WorkerReport(worker_id=self.worker_id, hello=self.hello)
        while True:
            try:
                msg = await asyncio.wait_for(self._out.get(), self.heartbeat_s)
            except TimeoutError:
                msg = pb.WorkerReport(worker_id=self.worker_id, heartbeat=True)
            if msg is None:
                return
            yield msg

    async def _read(self) -> None:
        assert self._call is not None
        try:
            async for cmd in self._call:
                self.received.append(cmd)
                self._arrived.set()
                if self.auto_ack:
                    if self.ack_delay_s:
                        await asyncio.sleep(self.ack_delay_s)
                    self.ack(cmd.command_id)
        except grpc.RpcError as e:
            self.error = e
        self._arrived.set()

    def ack(self, command_id: int, ok: bool = True) -> None:
        self._out.put_nowait(pb.WorkerReport(
            worker_id=self.worker_id, acks=[pb.CommandAck(command_id=command_id, ok=ok)]))

    def release(self, *request_ids: str) -> None:
        self._out.put_nowait(pb.WorkerReport(worker_id=self.worker_id,
                                             released=list(request_ids)))

    async def wait_for_commands(self, n: int, timeout: float = 5.0) -> list[pb.WorkerCommand]:
        """Wait until ``n`` commands arrived in total (or the stream ended)."""
        async with asyncio.timeout(timeout):
            while len(self.received) < n and not self.done:
                self._arrived.clear()
                await self._arrived.wait()
        return self.received[:n]

    @property
    def done(self) -> bool:
        return self._reader is not None and self._reader.done()

    async def stop(self, abrupt: bool = False) -> None:
        """End the session: politely (half-close) or abruptly (cancel, no goodbye)."""
        if abrupt and self._call is not None:
            self._call.cancel()
        self._out.put_nowait(None)
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
