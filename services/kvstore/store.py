"""The kvstore core: histories in shared-memory segments, owners, leases, capacity.

Plain Python (no gRPC). Thread-safe: one lock around every operation, which are short
(a bounded memcpy or one small manifest record rewrite). Every failing operation
changes nothing; every successful change of what survives a crash (open, commit,
close, expiry) is in the manifest before the method returns.

A history ``(request_id, source_id)`` is ``num_rows`` rows of ``row_bytes`` bytes at
offset 0 of its segment; ``backed`` is the set of committed rows (I1: ``H_r``).
Committed rows are immutable through this API: writing into them is refused.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from services.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from services.kvstore.keys import (
    PREFIX_RE,
    HistoryKey,
    check_id,
    check_key,
    check_lease,
    check_rows,
    check_shape,
)
from services.kvstore.leases import LeaseTable
from services.kvstore.manifest import HistoryRecord, Manifest
from services.kvstore.ranges import RangeSet
from services.kvstore.segments import Segment, segment_bytes, segment_name

log = logging.getLogger(__name__)

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """What the core needs from ``KVStoreConfig`` (sizes already in bytes)."""

    capacity: int
    shm_dir: Path
    prefix: str
    manifest_dir: Path
    default_lease_seconds: float = 60.0
    max_lease_seconds: float = 3600.0
    max_chunk_bytes: int = 4 << 20
    preallocate: bool = True

    def __post_init__(self) -> None:
        if not PREFIX_RE.match(self.prefix) or len(self.prefix) > 64:
            raise InvalidArgument(f"prefix={self.prefix!r}: expected 1..64 characters "
                                  "from [A-Za-z0-9._-], not starting or ending with '-'")
        if self.capacity <= 0 or self.max_chunk_bytes <= 0:
            raise InvalidArgument(f"capacity={self.capacity} and max_chunk_bytes="
                                  f"{self.max_chunk_bytes} must be > 0")


@dataclass(frozen=True, slots=True)
class HistoryInfo:
    """A snapshot of one history, as answered to callers."""

    request_id: str
    source_id: int
    owner: str
    row_bytes: int
    num_rows: int
    segment_path: str
    segment_bytes: int
    backed: Ranges
    lease_expires: float
    opening: int = 0  # which opening this answer belongs to (close_history's opening=)


@dataclass(frozen=True, slots=True)
class StoreStats:
    capacity_bytes: int
    used_bytes: int
    histories: int
    lease_expiries_total: int
    recovered_histories: int


@dataclass(slots=True)
class _History:
    record: HistoryRecord
    segment: Segment
    backed: RangeSet
    generation: int = 0  # unique per history this store process opened or recovered
    opening: int = 0  # its latest opening: a new value at creation and at every re-attach

    def info(self, lease_expires: float) -> HistoryInfo:
        r = self.record
        return HistoryInfo(r.request_id, r.source_id, r.owner, r.row_bytes, r.num_rows,
                           str(self.segment.path), r.segment_bytes, tuple(self.backed),
                           lease_expires, self.opening)


class KVStore:
    """All histories of one store ``prefix``; recovers the manifest on construction."""

    def __init__(self, options: StoreOptions, clock: Callable[[], float] = time.time) -> None:
        self.options = options
        self._clock = clock
        self._lock = threading.RLock()
        # keys whose segment is being allocated outside the lock (their bytes counted in
        # _used); a second open of one waits on _opened until the first one is done
        self._opening: set[HistoryKey] = set()
        self._opened = threading.Condition(self._lock)
        self._closing = False  # shutdown began: opens are refused (Unavailable)
        self._closed = False  # shutdown unmapped the segments
        self._histories: dict[HistoryKey, _History] = {}
        self._leases = LeaseTable()
        self._used = 0
        self._expiries = 0
        self._generations = itertools.count(1)
        # the openings of every history (one counter), above any an earlier store process
        # handed out (nanoseconds since the epoch): a client's opening from before a
        # restart never names a re-attach made after it
        self._openings = itertools.count(time.time_ns())
        self._manifest = Manifest(options.manifest_dir)
        self._segment_re = re.compile(rf"^{re.escape(options.prefix)}-[0-9a-f]{{32}}$")
        self._recovered = self._recover()

    # -- lifecycle -------------------------------------------------------------------

    def open(self, request_id: str, source_id: int, owner: str, row_bytes: int,
             num_rows: int, lease_seconds: float = 0.0, attach: bool = False,
             open_id: str = "") -> tuple[HistoryInfo, bool]:
        """Create a history (or, with ``attach``, re-attach the owner's identical one).

        Returns ``(info, created)``; ``created`` is also True for a re-attach carrying the
        ``open_id`` of the open that created the history (a retried open whose reply was
        lost). Raises ``AlreadyExists`` for a duplicate (or a re-attach with another
        shape), ``PermissionDenied`` for another owner's history, ``ResourceExhausted``
        when ``capacity`` cannot hold it.
        """
        key = check_key(request_id, source_id)
        check_id("owner", owner)
        if open_id:
            check_id("open_id", open_id)
        o = self.options
        check_shape(row_bytes, num_rows, o.max_chunk_bytes)
        lease = check_lease(lease_seconds, o.default_lease_seconds, o.max_lease_seconds)
        size = segment_bytes(row_bytes, num_rows)
        name = segment_name(o.prefix, request_id, source_id)
        with self._lock:
            self._opened.wait_for(lambda: key not in self._opening)  # the same key's open
            if self._closing:
                raise Unavailable(f"the store is shutting down: open of history "
                                  f"{request_id}/{source_id} refused")
            self._expire_key(key)  # a lease run out is gone, swept or not (as in _owned)
            if (h := self._histories.get(key)) is not None:
                info = self._reattach(h, key, owner, row_bytes, num_rows, lease, attach)
                return info, bool(open_id) and h.record.open_id == open_id
            if self._used + size > o.capacity:
                raise ResourceExhausted(
                    f"history {request_id}/{source_id} needs {size} bytes; "
                    f"{o.capacity - self._used} of capacity={o.capacity} are free")
            self._used += size  # reserved: the segment is allocated outside the lock
            self._opening.add(key)
        seg: Segment | None = None
        try:
            # posix_fallocate of a large segment takes seconds: renewals, reads and writes
            # of other histories go on meanwhile
            seg = Segment.create(o.shm_dir / name, size, o.preallocate)
            with self._lock:
                if self._closed:  # shutdown stopped waiting for this open: nothing kept
                    raise Unavailable(f"the store shut down while history {request_id}/"
                                      f"{source_id} was being allocated")
                deadline = self._clock() + lease
                record = HistoryRecord(request_id, source_id, owner, row_bytes, num_rows,
                                       name, size, deadline, open_id=open_id)
                self._manifest.save(record)
                h = _History(record, seg, RangeSet(), next(self._generations),
                             next(self._openings))
                self._histories[key] = h
                self._leases.renew(key, deadline)
                return h.info(deadline), True
        except BaseException:
            if seg is not None:
                seg.destroy()
            with self._lock:
                self._used -= size
            raise
        finally:
            with self._lock:
                self._opening.discard(key)
                self._opened.notify_all()

    def _reattach(self, h: _History, key: HistoryKey, owner: str, row_bytes: int,
                  num_rows: int, lease: float, attach: bool) -> HistoryInfo:
        r = h.record
        if not attach:
            raise AlreadyExists(f"history {key[0]}/{key[1]} is open already "
                                "(set attach to re-attach it)")
        if r.owner != owner:
            raise PermissionDenied(f"history {key[0]}/{key[1]} belongs to another owner, "
                                   f"not owner={owner!r}")
        if (r.row_bytes, r.num_rows) != (row_bytes, num_rows):
            raise AlreadyExists(
                f"history {key[0]}/{key[1]} exists with row_bytes={r.row_bytes}, "
                f"num_rows={r.num_rows}; asked for row_bytes={row_bytes}, num_rows={num_rows}")
        deadline = max(self._leases.deadline(key), self._clock() + lease)
        self._persist_leases([key], deadline)
        h.opening = next(self._openings)  # a close naming an earlier opening leaves it be
        return h.info(deadline)

    def close_history(self, request_id: str, source_id: int, owner: str, opening: int = 0
                      ) -> int:
        """Free a history; returns the bytes freed. ``opening`` (from the open's answer):
        only while the history is still that opening's -- a close that a re-attach of the
        same key overtook is refused (NotFound) and the re-attached history stays."""
        with self._lock:
            key, h = self._owned(request_id, source_id, owner)
            # a history recovered after a restart and not re-attached since (opening 0) is
            # still the opening its client mapped before the restart
            if opening and h.opening and h.opening != opening:
                raise NotFound(f"history {request_id}/{source_id} was opened again (opening "
                               f"{h.opening}) after opening {opening}, which this close names; "
                               "it stays open")
            return self._free(key)

    def _free(self, key: HistoryKey) -> int:
        h = self._histories[key]
        self._manifest.remove(h.record.segment)  # first: a crash leaves only an orphan
        del self._histories[key]
        self._leases.drop(key)
        h.segment.destroy()
        self._used -= h.record.segment_bytes
        return h.record.segment_bytes

    # -- rows ------------------------------------------------------------------------

    def generation(self, request_id: str, source_id: int) -> int:
        """The identity of the history now under this key: a stream that spans several calls
        passes it back (``generation=``) so that a history freed and re-created under the
        same key meanwhile is refused instead of silently written, committed or read."""
        with self._lock:
            return self._get(check_key(request_id, source_id)).generation

    def write(self, request_id: str, source_id: int, owner: str, start_row: int,
              data: bytes | memoryview, generation: int = 0) -> tuple[int, int]:
        """Copy whole rows into ``start_row ..``; returns the ``[start, stop)`` written.

        Refuses chunks over ``max_chunk_bytes``, partial rows, ranges outside the
        history and rows that are committed already (they are immutable).
        """
        n = len(data)
        if n > self.options.max_chunk_bytes:
            raise InvalidArgument(f"chunk of {n} bytes exceeds "
                                  f"max_chunk_bytes={self.options.max_chunk_bytes}")
        with self._lock:
            _, h = self._owned(request_id, source_id, owner, generation)
            rb, nr = h.record.row_bytes, h.record.num_rows
            if n == 0 or n % rb:
                raise InvalidArgument(f"chunk of {n} bytes is not a positive whole number "
                                      f"of rows of row_bytes={rb}")
            stop = start_row + n // rb
            check_rows(start_row, stop, nr, "write")
            if h.backed.intersects(start_row, stop):
                raise FailedPrecondition(f"write [{start_row}, {stop}) overlaps committed "
                                         f"rows {list(h.backed)}; committed rows are immutable")
            h.segment.write(start_row * rb, data)
            return start_row, stop

    def read(self, request_id: str, source_id: int, start: int, stop: int,
             require_backed: bool = False, generation: int = 0) -> bytes:
        """A copy of rows ``[start, stop)`` (any owner may read)."""
        with self._lock:
            h = self._same(self._get(check_key(request_id, source_id)), generation)
            check_rows(start, stop, h.record.num_rows, "read")
            if require_backed and not h.backed.covers(start, stop):
                raise FailedPrecondition(f"rows [{start}, {stop}) are not all committed; "
                                         f"committed: {list(h.backed)}")
            rb = h.record.row_bytes
            return h.segment.read(start * rb, (stop - start) * rb)

    def read_chunks(self, request_id: str, source_id: int, start: int, stop: int,
                    max_chunk_bytes: int = 0, require_backed: bool = False
                    ) -> Iterator[tuple[int, bytes]]:
        """Validate a read of ``[start, stop)`` now; return an iterator of ``(first_row, bytes)``
        chunks of at most ``max_chunk_bytes`` (0 or larger: the store's limit; at least
        one row each). Each chunk is read when the iterator reaches it."""
        limit = self.options.max_chunk_bytes
        limit = min(max_chunk_bytes, limit) if max_chunk_bytes > 0 else limit
        with self._lock:
            h = self._get(check_key(request_id, source_id))
            check_rows(start, stop, h.record.num_rows, "read")
            if require_backed and not h.backed.covers(start, stop):
                raise FailedPrecondition(f"rows [{start}, {stop}) are not all committed; "
                                         f"committed: {list(h.backed)}")
            step, gen = max(1, limit // h.record.row_bytes), h.generation
        return ((a, self.read(request_id, source_id, a, min(a + step, stop), generation=gen))
                for a in range(start, stop, step))

    def commit(self, request_id: str, source_id: int, owner: str,
               ranges: list[tuple[int, int]], generation: int = 0) -> Ranges:
        """Mark ``ranges`` backed, durably; returns every backed range afterwards."""
        with self._lock:
            _, h = self._owned(request_id, source_id, owner, generation)
            if not ranges:
                raise InvalidArgument("ranges is empty; commit at least one row range")
            backed = h.backed.copy()
            for start, stop in ranges:
                check_rows(start, stop, h.record.num_rows, "commit")
                backed.add(start, stop)
            if backed != h.backed:
                h.record.backed = [list(r) for r in backed]
                try:
                    self._manifest.save(h.record)
                except BaseException:
                    h.record.backed = [list(r) for r in h.backed]
                    raise
                h.backed = backed
            return tuple(backed)

    # -- leases ----------------------------------------------------------------------

    def renew(self, owner: str, keys: list[HistoryKey] | None = None,
              lease_seconds: float = 0.0) -> tuple[int, float]:
        """Extend the leases of ``keys`` (None or empty: all of ``owner``'s histories).

        All or nothing: an unknown key or another owner's history changes no lease.
        Returns ``(renewed, deadline)``.
        """
        check_id("owner", owner)
        o = self.options
        lease = check_lease(lease_seconds, o.default_lease_seconds, o.max_lease_seconds)
        with self._lock:
            if keys:
                chosen = [self._owned(rid, sid, owner)[0] for rid, sid in keys]
            else:
                now = self._clock()  # out of lease is gone, swept or not: never extended
                chosen = [k for k, h in self._histories.items()
                          if h.record.owner == owner and self._leases.deadline(k) > now]
            deadline = self._clock() + lease
            self._persist_leases(chosen, deadline)
            return len(chosen), deadline

    def _persist_leases(self, keys: list[HistoryKey], deadline: float) -> None:
        """Move the leases of ``keys`` to at least ``deadline``, the manifest first where it
        matters: a store restarted later keeps every lease a client was granted. Recovery
        grants at least restart time + default_lease_seconds, so a deadline within
        now + default_lease_seconds (every default-length renewal) needs no durable write.
        All or nothing: a failed manifest write changes no lease."""
        saved: list[tuple[HistoryRecord, float]] = []
        covered = self._clock() + self.options.default_lease_seconds  # by any recovery floor
        try:
            for key in keys:
                record = self._histories[key].record
                if deadline > max(record.lease_expires, covered):
                    saved.append((record, record.lease_expires))
                    record.lease_expires = deadline
                    self._manifest.save(record)
        except BaseException:
            for record, before in saved:
                record.lease_expires = before
                self._manifest.save(record)
            raise
        for key in keys:
            self._leases.renew(key, max(deadline, self._leases.deadline(key)))

    def expire(self) -> list[HistoryKey]:
        """Free every history whose lease ran out; returns their keys."""
        with self._lock:
            now = self._clock()
            due = self._leases.pop_expired(now)
            freed: list[HistoryKey] = []
            try:
                for key in due:
                    log.warning("lease of history %s/%s expired; freeing it", *key)
                    self._free(key)  # type: ignore[arg-type]
                    freed.append(key)  # type: ignore[arg-type]
            finally:
                # a failed free (e.g. the manifest's disk) leaves that history and the rest
                # due again on the next sweep instead of without a lease
                for key in due[len(freed):]:
                    self._leases.renew(key, now)
                self._expiries += len(freed)
            return freed

    def _expire_key(self, key: HistoryKey) -> None:
        """(Lock held.) Free ``key``'s history if its lease ran out, leaving every other
        history to the sweep (a history that cannot be freed fails only its own calls)."""
        if key in self._histories and self._leases.deadline(key) <= self._clock():
            log.warning("lease of history %s/%s expired; freeing it", *key)
            self._free(key)
            self._expiries += 1

    # -- queries ---------------------------------------------------------------------

    def info(self, request_id: str, source_id: int) -> HistoryInfo:
        with self._lock:
            key = check_key(request_id, source_id)
            return self._get(key).info(self._leases.deadline(key))

    def histories(self, owner: str | None = None) -> list[HistoryInfo]:
        with self._lock:
            return [h.info(self._leases.deadline(k)) for k, h in self._histories.items()
                    if owner is None or h.record.owner == owner]

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(self.options.capacity, self._used, len(self._histories),
                              self._expiries, self._recovered)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Unmap every segment, keeping files and manifest for the next start. New opens
        are refused from here on; an open still allocating its segment is waited for (up
        to ``timeout`` seconds) and its history kept like the others; one that outlasts the
        wait is refused and its segment removed."""
        with self._lock:
            self._closing = True
            if not self._opened.wait_for(lambda: not self._opening, timeout):
                log.warning("kvstore shutdown: %d open(s) still allocating after %.0fs are "
                            "refused", len(self._opening), timeout)
            self._closed = True
            for h in self._histories.values():
                h.segment.close()
            self._histories.clear()

    # -- internals -------------------------------------------------------------------

    def _get(self, key: HistoryKey) -> _History:
        h = self._histories.get(key)
        if h is None:
            raise NotFound(f"unknown history request_id={key[0]!r} source_id={key[1]}")
        return h

    @staticmethod
    def _same(h: _History, generation: int) -> _History:
        if generation and h.generation != generation:
            r = h.record
            raise NotFound(f"history request_id={r.request_id!r} source_id={r.source_id} was "
                           f"freed and opened again since this stream began")
        return h

    def _owned(self, request_id: str, source_id: int, owner: str, generation: int = 0
               ) -> tuple[HistoryKey, _History]:
        key = check_key(request_id, source_id)
        check_id("owner", owner)
        h = self._same(self._get(key), generation)
        if h.record.owner != owner:
            raise PermissionDenied(f"history {request_id}/{source_id} belongs to another "
                                   f"owner, not owner={owner!r}")
        if self._leases.deadline(key) <= self._clock():
            # the lease ran out before the sweeper came by: the history is already lost to
            # its owner, so nothing may be written or committed to it any more
            self._expire_key(key)
            raise NotFound(f"history request_id={request_id!r} source_id={source_id}: its "
                           f"lease expired")
        return key, h

    def _recover(self) -> int:
        """Re-attach every history of the manifest; delete orphan segments."""
        o = self.options
        floor = self._clock() + o.default_lease_seconds  # clients could not renew while down
        for r in self._manifest.load():
            key = (r.request_id, r.source_id)
            try:
                if r.segment != segment_name(o.prefix, r.request_id, r.source_id):
                    raise ValueError(f"segment name {r.segment!r} does not match its key")
                seg = Segment.attach(o.shm_dir / r.segment, r.segment_bytes)
            except (OSError, ValueError) as e:
                log.error("cannot re-attach history %s/%s: %s; dropping it", *key, e)
                self._manifest.remove(r.segment)
                continue
            self._histories[key] = _History(r, seg, RangeSet(map(tuple, r.backed)),
                                            next(self._generations))
            self._leases.renew(key, max(r.lease_expires, floor))
            self._used += r.segment_bytes
        live = {h.record.segment for h in self._histories.values()}
        for path in o.shm_dir.iterdir():
            if self._segment_re.match(path.name) and path.name not in live:
                log.warning("deleting orphan segment %s", path)
                path.unlink(missing_ok=True)
        if self._used > o.capacity:
            log.warning("recovered %d bytes exceed capacity=%d", self._used, o.capacity)
        return len(self._histories)
