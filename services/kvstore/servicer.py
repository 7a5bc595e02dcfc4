"""The gRPC shell of the kvstore: protobuf → core → protobuf, nothing else.

Domain errors propagate to ``services.common.interceptors.ErrorInterceptor``, which maps
them to status codes; this module only counts them.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from services.common.errors import DHiSparseError, InvalidArgument
from services.common.gen.dhisparse.v1 import kvstore_pb2 as pb
from services.common.gen.dhisparse.v1 import kvstore_pb2_grpc
from services.kvstore.metrics import KVStoreMetrics
from services.kvstore.ranges import RangeSet
from services.kvstore.store import HistoryInfo, KVStore

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["KVStore"].full_name


def _code(exc: BaseException) -> str:
    if isinstance(exc, DHiSparseError):
        return type(exc).code_name
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit, grpc.RpcError)):
        return "CANCELLED"  # the client went away (or cancelled): not a server fault
    return "INTERNAL"


def _counted(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Count a unary-response handler by method and outcome."""
    @functools.wraps(fn)
    async def wrapper(self: KVStoreServicer, request: Any, context: Any) -> Any:
        t0, code = time.perf_counter(), "OK"
        try:
            return await fn(self, request, context)
        except BaseException as exc:
            code = _code(exc)
            raise
        finally:
            self.metrics.observe(fn.__name__, code, time.perf_counter() - t0)
    return wrapper


def history_pb(info: HistoryInfo) -> pb.HistoryInfo:
    name = info.segment_path.rsplit("/", 1)[-1]
    return pb.HistoryInfo(
        key=pb.HistoryKey(request_id=info.request_id, source_id=info.source_id),
        owner=info.owner, row_bytes=info.row_bytes, num_rows=info.num_rows,
        segment_name=name, segment_path=info.segment_path, segment_offset=0,
        backed_rows=sum(b - a for a, b in info.backed),
        backed=ranges_pb(info.backed), lease_expires_unix=info.lease_expires,
        opening=info.opening)


def ranges_pb(ranges: tuple[tuple[int, int], ...]) -> list[pb.RowRange]:
    return [pb.RowRange(start=a, stop=b) for a, b in ranges]


class KVStoreServicer(kvstore_pb2_grpc.KVStoreServicer):
    def __init__(self, store: KVStore, metrics: KVStoreMetrics) -> None:
        self.store = store
        self.metrics = metrics

    @_counted
    async def OpenHistory(self, request: pb.OpenHistoryRequest, context: Any
                          ) -> pb.OpenHistoryResponse:
        # off the event loop: allocating a large segment takes seconds, and the loop serves
        # every other call (renewals) and the lease sweep meanwhile
        info, created = await asyncio.to_thread(
            self.store.open, request.key.request_id, request.key.source_id, request.owner,
            request.row_bytes, request.num_rows, request.lease_seconds, request.attach,
            request.open_id)
        return pb.OpenHistoryResponse(history=history_pb(info), attached=not created,
                                      max_chunk_bytes=self.store.options.max_chunk_bytes)

    @_counted
    async def WriteRows(self, request_iterator: AsyncIterator[pb.WriteRowsChunk], context: Any
                        ) -> pb.WriteRowsResponse:
        key: tuple[str, int] | None = None
        owner, commit, nbytes, written, gen = "", False, 0, RangeSet(), 0
        async for chunk in request_iterator:
            this = (chunk.key.request_id, chunk.key.source_id)
            if key is None:
                key, owner = this, chunk.owner
                gen = self.store.generation(*key)  # the whole stream writes this history
            elif (chunk.HasField("key") and this != key) or chunk.owner not in ("", owner):
                raise InvalidArgument(f"chunk names history {this[0]}/{this[1]} (owner "
                                      f"{chunk.owner!r}); the stream writes {key[0]}/{key[1]}")
            written.add(*self.store.write(*key, owner, chunk.first_row, chunk.data, gen))
            nbytes += len(chunk.data)
            commit |= chunk.commit
            self.metrics.stream_bytes.labels("write").inc(len(chunk.data))
        if key is None:
            raise InvalidArgument("WriteRows stream carried no chunk")
        if commit:
            backed = self.store.commit(*key, owner, list(written), gen)
        else:
            backed = self.store.info(*key).backed
        return pb.WriteRowsResponse(rows_written=written.count(), bytes_written=nbytes,
                                    backed=ranges_pb(backed))

    async def ReadRows(self, request: pb.ReadRowsRequest, context: Any
                       ) -> AsyncIterator[pb.ReadRowsChunk]:
        t0, code = time.perf_counter(), "OK"
        try:
            chunks = self.store.read_chunks(
                request.key.request_id, request.key.source_id, request.range.start,
                request.range.stop, request.max_chunk_bytes, request.require_backed)
            for first, data in chunks:
                self.metrics.stream_bytes.labels("read").inc(len(data))
                yield pb.ReadRowsChunk(first_row=first, data=data)
        except BaseException as exc:
            code = _code(exc)
            raise
        finally:
            self.metrics.observe("ReadRows", code, time.perf_counter() - t0)

    @_counted
    async def CommitRows(self, request: pb.CommitRowsRequest, context: Any
                         ) -> pb.CommitRowsResponse:
        backed = self.store.commit(request.key.request_id, request.key.source_id,
                                   request.owner, [(r.start, r.stop) for r in request.ranges])
        return pb.CommitRowsResponse(backed_rows=sum(b - a for a, b in backed),
                                     backed=ranges_pb(backed))

    @_counted
    async def CloseHistory(self, request: pb.CloseHistoryRequest, context: Any
                           ) -> pb.CloseHistoryResponse:
        freed = self.store.close_history(request.key.request_id, request.key.source_id,
                                         request.owner, request.opening)
        return pb.CloseHistoryResponse(freed_bytes=freed)

    @_counted
    async def RenewLease(self, request: pb.RenewLeaseRequest, context: Any
                         ) -> pb.RenewLeaseResponse:
        keys = [(k.request_id, k.source_id) for k in request.keys]
        renewed, deadline = self.store.renew(request.owner, keys, request.lease_seconds)
        return pb.RenewLeaseResponse(renewed=renewed, lease_expires_unix=deadline)

    @_counted
    async def GetStats(self, request: pb.GetStatsRequest, context: Any) -> pb.GetStatsResponse:
        s = self.store.stats()
        out = pb.GetStatsResponse(capacity_bytes=s.capacity_bytes, used_bytes=s.used_bytes,
                                  histories=s.histories, lease_expiries=s.lease_expiries_total)
        if request.include_histories:
            out.history.extend(
                history_pb(h) for h in self.store.histories(request.owner or None)
                if not request.request_id or h.request_id == request.request_id)
        return out
