"""Same-node client: maps history segments and implements ``services.common.backing``.

::

    client = KVStoreClient("127.0.0.1:50051", owner="decode-0")     # HostBackingProvider
    h = client.open("req-7", source_id=0, row_bytes=656, num_rows=100_000)
    h.write(0, rows)          # memcpy into the shared mapping (no RPC)
    h.commit(0, len(rows))    # CommitRows: durable in the store's manifest on return
    h.rows()[idx]             # zero-copy uint8 [num_rows, row_bytes] view
    client.close("req-7", 0)  # CloseHistory + unmap

Reads and writes touch only the mapping, so they keep working while the store is down
(kill -9): only ``commit``/``open``/``close`` need it (they raise ``Unavailable``). A
daemon thread renews every lease of ``owner`` each ``lease_seconds / 3``. On a CUDA
machine each mapping is registered with ``cudaHostRegister`` (mapped) and
``device_rows()`` gives kernels a device view of the same host bytes.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading

import grpc
import torch

from services.common.errors import (
    AlreadyExists,
    DHiSparseError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from services.common.gen.dhisparse.v1 import kvstore_pb2 as pb
from services.kvstore.rpc import KVStoreRPC, ranges_of

log = logging.getLogger(__name__)


class MappedHistory:
    """One history mapped into this process (implements ``HostBacking``)."""

    def __init__(self, rpc: KVStoreRPC, owner: str, info: pb.HistoryInfo,
                 register_cuda: bool) -> None:
        self.request_id, self.source_id = info.key.request_id, info.key.source_id
        self._rpc, self._owner = rpc, owner
        self._row_bytes, self._num_rows = info.row_bytes, info.num_rows
        fd = os.open(info.segment_path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._map: mmap.mmap | None = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        n = info.row_bytes * info.num_rows
        self._rows = torch.frombuffer(self._map, dtype=torch.uint8, count=n,
                                      offset=info.segment_offset
                                      ).view(info.num_rows, info.row_bytes)
        self._mask = torch.zeros(info.num_rows, dtype=torch.bool)
        self._set_backed(ranges_of(info.backed))
        self._dev_ptr: int | None = None
        self.created = True  # KVStoreClient.open: False when the store re-attached it
        self.opening = info.opening  # the store's opening this mapping came from (close)
        if register_cuda:
            from services.kvstore import cuda
            self._dev_ptr = cuda.register(self._rows.data_ptr(), n)

    # -- HostBacking -----------------------------------------------------------------

    @property
    def row_bytes(self) -> int:
        return self._row_bytes

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def closed(self) -> bool:
        return self._map is None

    def rows(self) -> torch.Tensor:
        self._check_open()
        return self._rows

    def backed_mask(self) -> torch.Tensor:
        return self._mask

    def write(self, start: int, data: torch.Tensor) -> None:
        self._check_open()
        if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] != self._row_bytes:
            raise InvalidArgument(f"data must be uint8 [n, {self._row_bytes}], got "
                                  f"{data.dtype} {list(data.shape)}")
        stop = start + data.shape[0]
        if not 0 <= start < stop <= self._num_rows:
            raise InvalidArgument(f"write [{start}, {stop}) must be a non-empty range inside "
                                  f"[0, {self._num_rows})")
        if bool(self._mask[start:stop].any()):
            raise FailedPrecondition(f"write [{start}, {stop}) overlaps committed rows; "
                                     "committed rows are immutable")
        self._rows[start:stop].copy_(data)

    def commit(self, start: int, stop: int) -> None:
        self.commit_ranges([(start, stop)])

    def commit_ranges(self, ranges: list[tuple[int, int]]) -> None:
        """Commit several ranges in one ``CommitRows`` (durable when it returns)."""
        self._check_open()
        self._set_backed(self._rpc.commit(self.request_id, self.source_id, self._owner, ranges))

    def refresh(self) -> None:
        """Reload the backed ranges from the store."""
        resp = self._rpc.stats(request_id=self.request_id, include_histories=True)
        for h in resp.history:
            if h.key.source_id == self.source_id:
                self._set_backed(ranges_of(h.backed))
                return
        raise NotFound(f"history {self.request_id}/{self.source_id} is gone from the store")

    def device_rows(self) -> torch.Tensor:
        """A CUDA ``uint8 [num_rows, row_bytes]`` view of the same host bytes (zero-copy)."""
        self._check_open()
        if self._dev_ptr is None:
            raise FailedPrecondition("history is not registered with CUDA")
        from services.kvstore import cuda
        return cuda.device_view(self._dev_ptr, (self._num_rows, self._row_bytes), self)

    def close(self) -> None:
        """Unregister and unmap (idempotent). Views handed out keep their pages alive."""
        if self._map is None:
            return
        if self._dev_ptr is not None:
            from services.kvstore import cuda
            cuda.unregister(self._rows.data_ptr())
            self._dev_ptr = None
        mapping, self._map = self._map, None
        del self._rows
        try:
            mapping.close()
        except BufferError:  # a caller still holds a view; unmapped when it is freed
            pass

    def _set_backed(self, ranges: tuple[tuple[int, int], ...]) -> None:
        mask = torch.zeros(self._num_rows, dtype=torch.bool)
        for a, b in ranges:
            mask[a:b] = True
        self._mask = mask

    def _check_open(self) -> None:
        if self._map is None:
            raise FailedPrecondition(f"history {self.request_id}/{self.source_id} is closed")


class KVStoreClient:
    """A decode worker's view of its node's kvstore (implements ``HostBackingProvider``)."""

    def __init__(self, target: str, owner: str, *, token: str | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 lease_seconds: float = 30.0, timeout: float = 10.0,
                 register_cuda: bool | None = None, renew: bool = True) -> None:
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.rpc = KVStoreRPC(target, token=token, credentials=credentials, timeout=timeout)
        self._register_cuda = (torch.cuda.is_available() if register_cuda is None
                               else register_cuda)
        self._open: dict[tuple[str, int], MappedHistory] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        if renew:
            self._renewer = threading.Thread(target=self._renew_forever, daemon=True,
                                             name=f"kvstore-lease-{owner}")
            self._renewer.start()

    def open(self, request_id: str, source_id: int, row_bytes: int, num_rows: int,
             open_id: str = "") -> MappedHistory:
        """Create or re-attach ``(request_id, source_id)`` and map it. ``open_id``: a token
        the caller repeats when it retries this open (see ``OpenHistoryRequest.open_id``)."""
        key = (request_id, source_id)
        with self._lock:
            if (h := self._open.get(key)) is not None and not h.closed:
                if (h.row_bytes, h.num_rows) != (row_bytes, num_rows):
                    raise AlreadyExists(
                        f"history {request_id}/{source_id} is open with row_bytes="
                        f"{h.row_bytes}, num_rows={h.num_rows}; asked for row_bytes="
                        f"{row_bytes}, num_rows={num_rows}")
                h.created = False
                return h
        resp = self.rpc.open(request_id, source_id, self.owner, row_bytes, num_rows,
                             self.lease_seconds, attach=True, open_id=open_id)
        try:
            h = MappedHistory(self.rpc, self.owner, resp.history, self._register_cuda)
        except BaseException:
            if not resp.attached:  # created for nothing: free it (the renewer would keep it)
                try:  # only this opening: a re-attach by another thread meanwhile stays
                    self.rpc.close(request_id, source_id, self.owner,
                                   opening=resp.history.opening)
                except Exception:  # the mapping error is the one to report
                    pass
            raise
        h.created = not resp.attached
        with self._lock:
            cur = self._open.get(key)
            if cur is not None and not cur.closed and cur.opening > h.opening:
                # a concurrent open of the key re-attached after this one: the table keeps
                # the later opening (the one a close must name); this mapping is nobody's
                h.close()
                cur.created = False
                return cur
            self._open[key] = h  # an earlier one replaced stays mapped for its holder
        return h

    def opening_of(self, request_id: str, source_id: int) -> int:
        """The store's opening of this client's mapping of the key (0: none mapped)."""
        with self._lock:
            h = self._open.get((request_id, source_id))
        return h.opening if h is not None else 0

    def detach(self, request_id: str, source_id: int) -> int:
        """Take the key's mapping out of this client's table and unmap it, without asking
        the store; returns its opening (0: none was mapped), which the ``close`` that frees
        the history in the store then names. An ``open`` of the key meanwhile asks the
        store (it re-attaches: that close is refused then and the history stays)."""
        with self._lock:
            h = self._open.pop((request_id, source_id), None)
        if h is None:
            return 0
        h.close()
        return h.opening

    def close(self, request_id: str, source_id: int, timeout: float | None = None,
              opening: int | None = None) -> None:
        """Free the history in the store and unmap it here. The mapping goes first
        (``detach``), whatever the store answers then: NotFound (its lease ran out, or a
        re-attach overtook the close), or no answer in time; an ``open`` of the key
        meanwhile asks the store (it re-attaches, or creates anew once the close went
        through) instead of handing out this mapping. The close names the opening it
        mapped, so a re-attach that reached the store first keeps the history (the close
        answers NotFound). ``timeout`` replaces the client's RPC timeout
        for this call; ``opening`` the mapping's opening (a retried close whose mapping went
        with its first attempt; 0 closes whatever the key holds)."""
        mapped = self.detach(request_id, source_id)
        self.rpc.close(request_id, source_id, self.owner, timeout,
                       opening=mapped if opening is None else opening)

    def renew(self) -> int:
        """Renew the leases of the histories this client has mapped; returns how many it
        covered. Not every history of ``owner``: one whose open failed here (created in the
        store, the reply lost) must run out. One key the store no longer knows does not
        stop the others (the store renews all or nothing: they go one by one then)."""
        with self._lock:
            keys = [k for k, h in self._open.items() if not h.closed]
        if not keys:
            return 0
        try:
            return self.rpc.renew(self.owner, keys, self.lease_seconds).renewed
        except (NotFound, PermissionDenied):
            renewed = 0
            for key in keys:
                try:
                    renewed += self.rpc.renew(self.owner, [key], self.lease_seconds).renewed
                except (NotFound, PermissionDenied) as exc:
                    log.warning("lease of %s/%d not renewed: %s", *key, exc)
            return renewed

    def shutdown(self) -> None:
        """Stop renewing, unmap everything (histories stay until their lease ends)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        with self._lock:
            handles, self._open = list(self._open.values()), {}
        for h in handles:
            h.close()
        self.rpc.close_channel()

    def __enter__(self) -> KVStoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _renew_forever(self) -> None:
        interval = max(0.05, self.lease_seconds / 3)
        while not self._stop.wait(interval):
            try:
                self.renew()
            except DHiSparseError as e:  # store down or restarting: keep mapping, retry
                log.warning("lease renewal for %s failed: %s", self.owner, e)
