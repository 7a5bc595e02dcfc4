"""Host backing that rides out a kvstore restart.

The mapped client (``services.kvstore.client``) reads and writes rows through its
shared-memory mapping, which keeps working while the store is down; only ``open``,
``commit`` and ``close`` need the store and raise ``Unavailable`` then (or
``DeadlineExceeded`` while it is stalled). This wrapper retries ``open`` and ``commit`` on
either, both being safe to repeat (the engine thread waits, then continues with the same
bytes: no token changes; a commit of rows already backed changes nothing), and hands every
``close`` to a background closer, so a release never waits for the store and a kill -9 of
the kvstore pauses decoding for the restart and loses nothing.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import torch

from services.common.backing import HostBacking
from services.common.errors import DeadlineExceeded, NotFound, ResourceExhausted, Unavailable
from services.common.logging import get_logger
from services.kvstore.client import KVStoreClient

log = get_logger("decode.backing")
T = TypeVar("T")


class RetryingHistory:
    """A mapped history whose ``commit`` waits for the store to come back."""

    def __init__(self, inner: HostBacking, retry: Callable[[Callable[[], T], str], T]) -> None:
        self._inner, self._retry = inner, retry

    @property
    def row_bytes(self) -> int:
        return self._inner.row_bytes

    @property
    def num_rows(self) -> int:
        return self._inner.num_rows

    def rows(self) -> torch.Tensor:
        return self._inner.rows()

    def backed_mask(self) -> torch.Tensor:
        return self._inner.backed_mask()

    def write(self, start: int, data: torch.Tensor) -> None:
        self._inner.write(start, data)

    def commit(self, start: int, stop: int) -> None:
        if start >= stop:          # nothing to mark (the store rejects empty ranges)
            return
        self._retry(lambda: self._inner.commit(start, stop), f"commit [{start}, {stop})")

    def close(self) -> None:
        self._inner.close()

    @property
    def created(self) -> bool:
        return self._inner.created


class RetryingProvider:
    """``HostBackingProvider`` over a :class:`KVStoreClient` with retries (see module doc)."""

    RETRY_AFTER_S = 0.5  # a close the store did not take is tried again this much later

    def __init__(self, client: KVStoreClient, retry_seconds: float = 60.0,
                 backoff_s: float = 0.1, close_timeout_s: float = 1.0) -> None:
        self.client = client
        self.retry_seconds = retry_seconds
        self.backoff_s = backoff_s
        # one attempt of a close waits at most this long for the store (an open of a key
        # whose close is queued waits for that close only)
        self.close_timeout_s = close_timeout_s
        self.retries = 0
        # closes not through yet, oldest first: (request, source, opening); the one the
        # closer is trying is _trying
        self._pending: list[tuple[str, int, int]] = []
        self._trying: tuple[str, int, int] | None = None
        self._retry_at = 0.0
        self._cv = threading.Condition()
        self._stop = False
        self._closer = threading.Thread(target=self._close_pending, daemon=True,
                                        name="kvstore-close")
        self._closer.start()

    def _retry(self, fn: Callable[[], T], what: str) -> T:
        deadline = time.monotonic() + self.retry_seconds
        while True:
            try:
                return fn()
            except (Unavailable, DeadlineExceeded) as exc:
                if time.monotonic() > deadline:
                    raise
                self.retries += 1
                if self.retries % 20 == 1:
                    log.warning("kvstore unavailable or late; retrying %s: %s", what, exc)
                time.sleep(self.backoff_s)

    def open(self, request_id: str, source_id: int, row_bytes: int,
             num_rows: int) -> RetryingHistory:
        """Create (or re-attach) the history. A close of the same key still queued goes
        through first, as it would have before a synchronous release returned: the open
        then creates the history anew (a re-attach of the released one would keep its old
        rows, and a failed admission would not free it). Capacity the queued closes are
        about to free is waited for: ResourceExhausted while closes are queued is retried
        once they went through. Both waits end with ``retry_seconds`` (Unavailable)."""
        key = (request_id, source_id)
        deadline = time.monotonic() + self.retry_seconds
        self._wait_closes(lambda: not self._queued(key), deadline, f"the close of {key}")
        # one token for every attempt: a retry after a lost reply still learns that this
        # open created the history (a failed admission must free it)
        token = uuid.uuid4().hex
        while True:
            try:
                inner = self._retry(lambda: self.client.open(request_id, source_id, row_bytes,
                                                             num_rows, open_id=token),
                                    f"open {request_id}")
                return RetryingHistory(inner, self._retry)
            except ResourceExhausted:
                with self._cv:
                    waiting = self._deferred_locked()
                if not waiting:
                    raise
                self._wait_closes(lambda n=waiting: self._deferred_locked() < n, deadline,
                                  "capacity from the queued closes")

    def _queued(self, key: tuple[str, int]) -> bool:
        """(cv held.) A close of ``key`` waits or is being tried."""
        return any(d[:2] == key for d in self._pending) or (
            self._trying is not None and self._trying[:2] == key)

    def _deferred_locked(self) -> int:
        """(cv held.) Closes not through yet."""
        return len(self._pending) + (self._trying is not None)

    def _wait_closes(self, done: Callable[[], bool], deadline: float, what: str) -> None:
        with self._cv:
            if not self._cv.wait_for(done, max(0.0, deadline - time.monotonic())):
                raise Unavailable(f"waited {self.retry_seconds}s for {what}: the kvstore "
                                  "does not take the queued closes")

    def close(self, request_id: str, source_id: int) -> None:
        """Release the history without waiting for the store: its mapping goes here at once
        (``KVStoreClient.detach``) and the background closer frees it in the store, trying
        again every RETRY_AFTER_S while the store cannot answer (down, restarting, slow;
        one attempt waits at most ``close_timeout_s``). NotFound ends it: the lease ran out
        meanwhile (freed already) or the key was opened again after this close set out
        (the close names the opening it mapped, and the store keeps the newer one)."""
        opening = self.client.detach(request_id, source_id)
        with self._cv:
            self._pending.append((request_id, source_id, opening))
            self._cv.notify_all()

    @property
    def deferred(self) -> int:
        """Closes not through yet (queued, or being tried)."""
        with self._cv:
            return self._deferred_locked()

    def _close_pending(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not (
                        self._pending and time.monotonic() >= self._retry_at):
                    self._cv.wait(max(0.01, self._retry_at - time.monotonic())
                                  if self._pending else None)
                if self._stop:
                    return
                entry = self._trying = self._pending.pop(0)
            through = False
            try:
                through = self._close_one(*entry)
            finally:
                with self._cv:
                    self._trying = None
                    if not through:  # first again: closes go through in release order
                        self._pending.insert(0, entry)
                        self._retry_at = time.monotonic() + self.RETRY_AFTER_S
                    self._cv.notify_all()

    def _close_one(self, request_id: str, source_id: int, opening: int) -> bool:
        """One attempt; False when the store did not answer (kept for later). A refusal
        other than NotFound is logged and dropped: kept, it would hold every later close
        (they go in release order); the history runs out with its lease (not renewed:
        detached)."""
        try:
            self.client.close(request_id, source_id, timeout=self.close_timeout_s,
                              opening=opening)
        except NotFound:
            pass                      # freed already, or opened again since
        except (Unavailable, DeadlineExceeded):
            return False              # down, restarting or stalled: try again later
        except Exception as exc:
            log.warning("kvstore close of %s/%d refused, left to its lease: %s", request_id,
                        source_id, exc)
        return True

    def shutdown(self, flush_s: float = 2.0) -> None:
        """Give the queued closes up to ``flush_s`` to go through (what is left runs out
        with its lease), then stop the closer and the client."""
        with self._cv:
            self._cv.wait_for(lambda: not self._pending and self._trying is None, flush_s)
            self._stop = True
            self._cv.notify_all()
        self._closer.join(timeout=self.close_timeout_s + 1)
        self.client.shutdown()
