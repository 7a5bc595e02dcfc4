"""A synchronous KVStore stub wrapper: typed calls, chunked streams, domain errors.

Used by the mapped client (``client.py``), remote peers, tests and the benchmark. Status
codes come back as the domain errors of ``services.common.errors`` (the inverse of the
server's interceptor), so callers never handle ``grpc.RpcError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from services.common import errors
from services.common.gen.dhisparse.v1 import kvstore_pb2 as pb
from services.common.gen.dhisparse.v1 import kvstore_pb2_grpc
from services.common.interceptors import token_metadata
from services.common.server import MAX_MESSAGE_BYTES

T = TypeVar("T")
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # A restarted store should be found within ~0.5 s, not after grpc's 1..120 s backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)
_ERROR_OF: dict[grpc.StatusCode, type[errors.DHiSparseError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: errors.PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
    grpc.StatusCode.CANCELLED: errors.Cancelled,
}


def domain_error(err: grpc.RpcError) -> errors.DHiSparseError:
    """The domain error of a failed call (``DHiSparseError`` for unmapped codes)."""
    code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = err.details() if isinstance(err, grpc.Call) else str(err)
    exc = _ERROR_OF.get(code, errors.DHiSparseError)(f"kvstore: {code.name}: {details}")
    exc.grpc_code = code  # type: ignore[attr-defined]
    return exc


def key_pb(request_id: str, source_id: int) -> pb.HistoryKey:
    return pb.HistoryKey(request_id=request_id, source_id=source_id)


def ranges_of(msg_ranges: Any) -> tuple[tuple[int, int], ...]:
    return tuple((r.start, r.stop) for r in msg_ranges)


class KVStoreRPC:
    """Typed synchronous calls to one kvstore. Thread-safe (grpc channels are)."""

    def __init__(self, target: str, token: str | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 timeout: float = 10.0) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = (grpc.secure_channel(target, credentials, CHANNEL_OPTIONS)
                         if credentials is not None
                         else grpc.insecure_channel(target, CHANNEL_OPTIONS))
        self.stub = kvstore_pb2_grpc.KVStoreStub(self._channel)
        self.metadata = token_metadata(token)

    def _call(self, fn: Callable[..., T], request: Any, wait: bool = False,
              timeout: float | None = None) -> T:
        try:
            return fn(request, timeout=self.timeout if timeout is None else timeout,
                      metadata=self.metadata, wait_for_ready=wait)
        except grpc.RpcError as e:
            raise domain_error(e) from None

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the store answers (e.g. after a restart)."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise errors.Unavailable(f"kvstore at {self.target} not ready in {timeout}s") from None

    def open(self, request_id: str, source_id: int, owner: str, row_bytes: int, num_rows: int,
             lease_seconds: float = 0.0, attach: bool = False, open_id: str = ""
             ) -> pb.OpenHistoryResponse:
        return self._call(self.stub.OpenHistory, pb.OpenHistoryRequest(
            key=key_pb(request_id, source_id), owner=owner, row_bytes=row_bytes,
            num_rows=num_rows, lease_seconds=lease_seconds, attach=attach, open_id=open_id))

    def commit(self, request_id: str, source_id: int, owner: str,
               ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
        resp = self._call(self.stub.CommitRows, pb.CommitRowsRequest(
            key=key_pb(request_id, source_id), owner=owner,
            ranges=[pb.RowRange(start=a, stop=b) for a, b in ranges]))
        return ranges_of(resp.backed)

    def close(self, request_id: str, source_id: int, owner: str,
              timeout: float | None = None, opening: int = 0) -> int:
        return self._call(self.stub.CloseHistory, pb.CloseHistoryRequest(
            key=key_pb(request_id, source_id), owner=owner, opening=opening),
            timeout=timeout).freed_bytes

    def renew(self, owner: str, keys: list[tuple[str, int]] | None = None,
              lease_seconds: float = 0.0) -> pb.RenewLeaseResponse:
        return self._call(self.stub.RenewLease, pb.RenewLeaseRequest(
            owner=owner, lease_seconds=lease_seconds,
            keys=[key_pb(r, s) for r, s in keys or ()]))

    def stats(self, owner: str = "", request_id: str = "",
              include_histories: bool = False) -> pb.GetStatsResponse:
        return self._call(self.stub.GetStats, pb.GetStatsRequest(
            owner=owner, request_id=request_id, include_histories=include_histories))

    def write_rows(self, request_id: str, source_id: int, owner: str, first_row: int,
                   data: bytes | memoryview, row_bytes: int, max_chunk_bytes: int = 4 << 20,
                   commit: bool = False) -> pb.WriteRowsResponse:
        """Stream ``data`` (whole rows) in chunks of at most ``max_chunk_bytes``."""
        view = memoryview(data).cast("B")
        step = max(1, max_chunk_bytes // row_bytes) * row_bytes

        def chunks() -> Iterator[pb.WriteRowsChunk]:
            key = key_pb(request_id, source_id)
            for off in range(0, max(len(view), 1), step):
                yield pb.WriteRowsChunk(key=key, owner=owner,
                                        first_row=first_row + off // row_bytes,
                                        data=bytes(view[off:off + step]), commit=commit)
        return self._call(self.stub.WriteRows, chunks())

    def read_rows(self, request_id: str, source_id: int, start: int, stop: int,
                  require_backed: bool = False, max_chunk_bytes: int = 0) -> bytes:
        """Rows ``[start, stop)`` as one bytes object."""
        request = pb.ReadRowsRequest(key=key_pb(request_id, source_id),
                                     range=pb.RowRange(start=start, stop=stop),
                                     max_chunk_bytes=max_chunk_bytes,
                                     require_backed=require_backed)
        try:
            parts = [c.data for c in self.stub.ReadRows(request, timeout=self.timeout,
                                                        metadata=self.metadata)]
        except grpc.RpcError as e:
            raise domain_error(e) from None
        return b"".join(parts)

    def close_channel(self) -> None:
        self._channel.close()
