"""Host backing that rides out a kvstore restart.

The mapped client (``services.kvstore.client``) reads and writes rows through its
shared-memory mapping, which keeps working while the store is down; only ``open``,
``commit`` and ``close`` need the store and raise ``Unavailable`` then (or
``DeadlineExceeded`` while it is stalled). This wrapper retries ``open`` and ``commit`` on
either, both being safe to repeat (the engine thread waits, then continues with the same
bytes: no token changes; a commit of rows already backed changes nothing), and defers
``close`` to a background thread, so a kill -9 of the kvstore pauses decoding for the
restart and loses nothing.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import torch

from services.common.backing import HostBacking
from services.common.errors import DeadlineExceeded, DHiSparseError, NotFound, Unavailable
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

    def __init__(self, client: KVStoreClient, retry_seconds: float = 60.0,
                 backoff_s: float = 0.1, close_timeout_s: float = 1.0) -> None:
        self.client = client
        self.retry_seconds = retry_seconds
        self.backoff_s = backoff_s
        # a close waits at most this long for the store (then it is deferred): the engine
        # thread releases, and an open waits behind the closer's attempt
        self.close_timeout_s = close_timeout_s
        self.retries = 0
        self._deferred: list[tuple[str, int, int]] = []  # (request, source, opening)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closer = threading.Thread(target=self._close_deferred, daemon=True,
                                        name="kvstore-deferred-close")
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
        with self._lock:  # wanted again before its deferred close ran: keep it
            self._deferred = [d for d in self._deferred if d[:2] != (request_id, source_id)]
        # one token for every attempt: a retry after a lost reply still learns that this
        # open created the history (a failed admission must free it)
        token = uuid.uuid4().hex
        inner = self._retry(lambda: self.client.open(request_id, source_id, row_bytes,
                                                     num_rows, open_id=token),
                            f"open {request_id}")
        return RetryingHistory(inner, self._retry)

    def close(self, request_id: str, source_id: int) -> None:
        """Free the history now, or later from a background thread when the store cannot
        answer (down, restarting, slow): a release waits for the store at most
        ``close_timeout_s`` per history (it used to wait the client's 10 s RPC timeout) and
        never fails for it. NotFound means its lease ran out meanwhile (it is freed already)
        or the key was opened again after this close set out (the store keeps that one).
        The close names the opening it maps, retries too: a key opened again meanwhile
        is not freed by this close."""
        opening = self.client.opening_of(request_id, source_id)
        try:
            self.client.close(request_id, source_id, timeout=self.close_timeout_s,
                              opening=opening)
        except NotFound:
            pass
        except DHiSparseError as exc:
            log.warning("kvstore close of %s/%d deferred: %s", request_id, source_id, exc)
            with self._lock:
                self._deferred.append((request_id, source_id, opening))

    @property
    def deferred(self) -> int:
        with self._lock:
            return len(self._deferred)

    def _close_deferred(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:  # held across the closes: an open of a key waits for its
                self._close_some()  # close to go through or to stay deferred

    def _close_some(self) -> None:
        """(Lock held.) Retry the deferred closes in order until one fails to reach the store."""
        todo, self._deferred = self._deferred, []
        for i, (request_id, source_id, opening) in enumerate(todo):
            try:
                self.client.close(request_id, source_id, timeout=self.close_timeout_s,
                                  opening=opening)
            except NotFound:
                pass                      # its lease expired meanwhile: already freed
            except Exception as exc:      # anything else: keep the rest for next time
                if not isinstance(exc, Unavailable):
                    log.warning("deferred kvstore close of %s/%d failed: %s", request_id,
                                source_id, exc)
                self._deferred.extend(todo[i:])
                break

    def shutdown(self) -> None:
        self._stop.set()
        self._closer.join(timeout=2)
        self.client.shutdown()
