"""Staging arena: overflow rows of a resolve whose miss union exceeds the free hot slots.

One arena per source group, at the end of every payload tensor of the group::

    pool rows: [ pages: num_pages * p ][ staging: staging_rows ]
                                        ^ base_row

Life of a staged row (paper §3.4)::

    resolve ──acquire(rows, epoch)──> staged (protected; attention reads it)
    readers_finished(epoch) ──> release_staging(group):
        promote: copy staged row -> an LRU hot slot not used since before that epoch
        release: the arena row is free again

Promotion is deterministic (kernels reproduce it): requests in acquisition order, each
request's staged rows in acquisition order (ascending source row within one resolve),
victim slots by (stamp, slot index) ascending among slots whose stamp is older than the
staged row's epoch and that do not already hold the row.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.common.errors import FailedPrecondition, ResourceExhausted

from .request import lru_order

if TYPE_CHECKING:
    from .group import SourceGroup


@dataclass(frozen=True, slots=True)
class StagedRow:
    request_id: str
    row: int  # source row index
    loc: int  # pool row in the arena
    epoch: int  # resolve that staged it


class StagingArena:
    """Pool rows ``base_row .. base_row + capacity - 1`` with a free list."""

    def __init__(self, base_row: int, capacity: int) -> None:
        self.base_row = base_row
        self.capacity = capacity
        self.free_locs: deque[int] = deque(range(base_row, base_row + capacity))
        self.staged: dict[int, StagedRow] = {}  # loc -> entry, in acquisition order

    def can_acquire(self, n: int) -> bool:
        return n <= len(self.free_locs)

    def acquire(self, request_id: str, rows: list[int], epoch: int) -> list[int]:
        if not self.can_acquire(len(rows)):
            raise ResourceExhausted(
                f"staging rows={len(rows)} exceed the free staging rows={len(self.free_locs)} "
                f"(staging_rows={self.capacity}); release staging or raise staging_rows"
            )
        locs = [self.free_locs.popleft() for _ in rows]
        for row, loc in zip(rows, locs, strict=True):
            self.staged[loc] = StagedRow(request_id, row, loc, epoch)
        return locs

    @property
    def max_epoch(self) -> int:
        return max((e.epoch for e in self.staged.values()), default=0)

    def release(self, finished_epoch: int) -> list[StagedRow]:
        """Free every staged row; FailedPrecondition while any of its readers run."""
        if self.max_epoch > finished_epoch:
            raise FailedPrecondition(
                f"staged rows of epoch={self.max_epoch} still have readers "
                f"(finished_epoch={finished_epoch}); call readers_finished first"
            )
        entries = list(self.staged.values())
        self.staged.clear()
        self.free_locs.extend(e.loc for e in entries)
        return entries

    def drop_request(self, request_id: str) -> None:
        """Free the rows of a released request (its readers finished)."""
        for loc in [loc for loc, e in self.staged.items() if e.request_id == request_id]:
            del self.staged[loc]
            self.free_locs.append(loc)


def release_staging(group: SourceGroup) -> int:
    """Promote staged rows into hot slots, then free the arena. Returns rows promoted.

    Needs every reader of the staged epochs finished and every plan applied to all payload
    layers (FailedPrecondition otherwise; nothing changed).
    """
    if group.pending_layers:
        raise FailedPrecondition(
            f"plan of epoch={group.pending_epoch} not applied to payload layers "
            f"{sorted(group.pending_layers)}; apply_copies before release_staging"
        )
    promoted = 0
    for entry in group.staging.release(group.finished_epoch):
        state = group.requests.get(entry.request_id)
        if state is None or state.hot_rows.numel() == 0:
            continue
        eligible = (state.hot_stamp < entry.epoch) & (state.hot_protect <= group.finished_epoch)
        if bool((state.hot_rows == entry.row).any()) or not bool(eligible.any()):
            continue
        slot = lru_order(state.hot_stamp, eligible)[0]
        dst = state.hot_locs[slot]
        for payload in group.payloads:
            payload[dst] = payload[entry.loc]
        state.hot_rows[slot] = entry.row
        state.hot_stamp[slot] = entry.epoch
        promoted += 1
    return promoted

