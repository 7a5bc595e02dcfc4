"""The gRPC shell of the decode worker: protobuf → :class:`DecodeWorker` → protobuf.

Domain errors propagate to ``services.common.interceptors.ErrorInterceptor``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc

from services.common.errors import InvalidArgument
from services.common.gen.dhisparse.v1 import decode_pb2 as pb
from services.common.gen.dhisparse.v1 import decode_pb2_grpc
from services.decode.engine.request import GenerateSpec
from services.decode.worker import DecodeWorker, Finished, TokenBatch

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Decode"].full_name
# the engine's names of the speculation modes (MODE_UNSPECIFIED: the worker's)
MODES = {pb.SpeculationSettings.FIXED: "fixed", pb.SpeculationSettings.CONFIDENCE: "confidence"}


def generate_spec(request: pb.GenerateRequest) -> GenerateSpec:
    """The request as the engine sees it. Speculation off = rounds of one query (K_r = 1);
    on with block 0 = the worker's K_max."""
    rid = request.request_id or uuid.uuid4().hex
    prompt = list(request.prompt_tokens)
    if not prompt and not request.prefix_id:
        raise InvalidArgument(f"request {rid!r}: prompt_tokens is empty and no prefix_id is "
                              "given: send a non-empty prompt or a registered prefix")
    if prompt and request.prefix_id:
        raise InvalidArgument(f"request {rid!r}: give prompt_tokens or prefix_id="
                              f"{request.prefix_id!r}, not both")
    spec, sampling = request.speculation, request.sampling
    block = spec.block if spec.enabled else 1
    mode = MODES.get(spec.mode)
    if mode is None and spec.mode:
        raise InvalidArgument(f"speculation.mode={spec.mode}: unknown (expected one of "
                              f"{sorted(pb.SpeculationSettings.Mode.keys())})")
    return GenerateSpec(
        rid, request.max_new_tokens, prompt=prompt or None, prefix_id=request.prefix_id,
        spec_block=block, seed=sampling.seed,
        temperature=sampling.temperature if sampling.HasField("temperature") else None,
        spec_mode=mode if spec.enabled else None,
        confidence_threshold=(spec.confidence_threshold
                              if spec.enabled and spec.HasField("confidence_threshold") else None))


class DecodeServicer(decode_pb2_grpc.DecodeServicer):
    def __init__(self, worker: DecodeWorker) -> None:
        self.worker = worker

    async def Generate(self, request: pb.GenerateRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateResponse]:
        spec = generate_spec(request)
        try:
            stream = await self.worker.submit(spec)
        except asyncio.CancelledError:
            # the client left while the engine thread took the request: it may be queued
            # already (its result dropped); cancel it, after it (the inbox is FIFO)
            self.worker.cancel(spec.request_id)
            raise
        finished = False
        first = True
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if isinstance(item, Finished):
                    finished = True
                    yield pb.GenerateResponse(finish_reason=pb.GenerateResponse.LENGTH,
                                              worker_id=self.worker.worker_id)
                    return
                yield self._response(item, stream.run, first)
                first = False
        finally:
            if not finished:              # the client cancelled or the server is stopping
                self.worker.cancel(spec.request_id)

    def _response(self, batch: TokenBatch, run: Any, first: bool) -> pb.GenerateResponse:
        events = [pb.TokenEvent(token_id=t, index=batch.first_index + i, time_s=batch.time_s,
                                round=batch.round) for i, t in enumerate(batch.tokens)]
        msg = pb.GenerateResponse(tokens=events, worker_id=self.worker.worker_id)
        if first:
            msg.ttft_s = batch.time_s
            wait = run.admission_wait if run is not None else None
            msg.admission_wait_s = wait or 0.0
        return msg

    async def GetStatus(self, request: pb.GetStatusRequest,
                        context: grpc.aio.ServicerContext) -> pb.GetStatusResponse:
        return pb.GetStatusResponse(**await self.worker.status())


def register(servicer: DecodeServicer, server: Any) -> None:
    decode_pb2_grpc.add_DecodeServicer_to_server(servicer, server)
