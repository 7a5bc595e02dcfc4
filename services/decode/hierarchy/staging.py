"""Staging arena: overflow rows of a resolve whose miss union exceeds the free hot slots.

A standalone source group has its own arena at the end of every payload tensor::

    pool rows: [ pages: num_pages * p ][ staging: staging_rows ]
                                        ^ base_row

A ``Hierarchy`` of several groups shares ONE arena between them (paper §3.4: groups run
one after another, so the arena of a finished group is reused by the next). Each group
then sees it through a ``StagingView`` that only acquires, lists and releases its own
rows; rows of group g must be released (readers finished, promoted) before group g+1
can use them, so a later group never overwrites rows an earlier one still reads::

    shared payload tensor of payload layer m (every group's view starts at row 0):
    [ staging: S ][ pages of group 0 ][ pages of group 1 ] ... [ pages of group G-1 ]
      ^ base_row 0  ^ first_page = S/p  ^ S/p + M

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

import torch

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
    owner: str = ""  # source group that staged it (shared arenas)


class StagingArena:
    """Pool rows ``base_row .. base_row + capacity - 1`` with a free list."""

    def __init__(self, base_row: int, capacity: int) -> None:
        self.base_row = base_row
        self.capacity = capacity
        self.free_locs: deque[int] = deque(range(base_row, base_row + capacity))
        self.staged: dict[int, StagedRow] = {}  # loc -> entry, in acquisition order

    def can_acquire(self, n: int) -> bool:
        return n <= len(self.free_locs)

    def acquire(self, request_id: str, rows: list[int], epoch: int,
                owner: str = "") -> list[int]:
        if not self.can_acquire(len(rows)):
            raise ResourceExhausted(
                f"staging rows={len(rows)} exceed the free staging rows={len(self.free_locs)} "
                f"(staging_rows={self.capacity}); release staging or raise staging_rows"
            )
        locs = [self.free_locs.popleft() for _ in rows]
        for row, loc in zip(rows, locs, strict=True):
            self.staged[loc] = StagedRow(request_id, row, loc, epoch, owner)
        return locs

    def entries(self, owner: str | None = None) -> list[StagedRow]:
        """Staged rows in acquisition order (of one owner, or all)."""
        return [e for e in self.staged.values() if owner is None or e.owner == owner]

    @property
    def max_epoch(self) -> int:
        return max((e.epoch for e in self.staged.values()), default=0)

    def release(self, finished_epoch: int, owner: str | None = None) -> list[StagedRow]:
        """Free the staged rows (of ``owner``); FailedPrecondition while readers run."""
        entries = self.entries(owner)
        busy = max((e.epoch for e in entries), default=0)
        if busy > finished_epoch:
            raise FailedPrecondition(
                f"staged rows of epoch={busy} still have readers "
                f"(finished_epoch={finished_epoch}); call readers_finished first"
            )
        for e in entries:
            del self.staged[e.loc]
        self.free_locs.extend(e.loc for e in entries)
        return entries

    def drop_request(self, request_id: str, owner: str | None = None) -> None:
        """Free the rows of a released request (its readers finished)."""
        for e in self.entries(owner):
            if e.request_id == request_id:
                del self.staged[e.loc]
                self.free_locs.append(e.loc)

    def all_locs(self) -> list[int]:
        """Every arena row, free or staged (by any owner): the I6 balance check."""
        return list(self.free_locs) + list(self.staged)


class StagingView:
    """One source group's window on a shared ``StagingArena`` (same interface)."""

    def __init__(self, arena: StagingArena, owner: str) -> None:
        self.arena = arena
        self.owner = owner

    @property
    def base_row(self) -> int:
        return self.arena.base_row

    @property
    def capacity(self) -> int:
        return self.arena.capacity

    @property
    def free_locs(self) -> deque[int]:
        return self.arena.free_locs

    @property
    def staged(self) -> dict[int, StagedRow]:
        return {e.loc: e for e in self.arena.entries(self.owner)}

    def can_acquire(self, n: int) -> bool:
        return self.arena.can_acquire(n)

    def acquire(self, request_id: str, rows: list[int], epoch: int) -> list[int]:
        return self.arena.acquire(request_id, rows, epoch, self.owner)

    @property
    def max_epoch(self) -> int:
        return max((e.epoch for e in self.arena.entries(self.owner)), default=0)

    def release(self, finished_epoch: int) -> list[StagedRow]:
        return self.arena.release(finished_epoch, self.owner)

    def drop_request(self, request_id: str) -> None:
        self.arena.drop_request(request_id, self.owner)

    def all_locs(self) -> list[int]:
        return self.arena.all_locs()


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
    entries = group.staging.release(group.finished_epoch)
    promoted, i = 0, 0
    while i < len(entries):  # runs of one (request, epoch): one resolve's staged rows
        j = i + 1
        while (j < len(entries) and entries[j].request_id == entries[i].request_id
               and entries[j].epoch == entries[i].epoch):
            j += 1
        promoted += _promote_run(group, entries[i:j])
        i = j
    return promoted


def _promote_run(group: SourceGroup, run: list[StagedRow]) -> int:
    """Promote one resolve's staged rows of one request, all at once.

    Equal to promoting them one by one (``_promote_one``): the rows of one resolve are
    distinct misses, so none is held by a slot; a promoted slot takes the run's epoch as
    its stamp and so leaves the eligible set (stamp < epoch), which makes the i-th row take
    the i-th eligible slot in LRU order, until the eligible slots run out. Where that
    premise fails (a row repeated or already held) the rows go one by one.
    """
    state = group.requests.get(run[0].request_id)
    if state is None or state.hot_rows.numel() == 0:
        return 0
    epoch, dev = run[0].epoch, state.hot_rows.device
    rows = torch.tensor([e.row for e in run], dtype=torch.int64, device=dev)
    held = torch.isin(rows, state.hot_rows).any()
    eligible = (state.hot_stamp < epoch) & (state.hot_protect <= group.finished_epoch)
    slots = lru_order(state.hot_stamp, eligible)  # one device read (nonzero)
    if len({e.row for e in run}) != len(run) or bool(held):
        return sum(_promote_one(group, state, e) for e in run)
    n = min(len(run), int(slots.numel()))
    if n == 0:
        return 0
    slots = slots[:n]
    dst = state.hot_locs[slots]
    src = torch.tensor([e.loc for e in run[:n]], dtype=torch.int64, device=dev)
    for payload in group.payloads:
        payload[dst] = payload[src]
    state.hot_rows[slots] = rows[:n]
    state.hot_stamp[slots] = epoch
    return n


def _promote_one(group: SourceGroup, state, entry: StagedRow) -> int:
    """The definition: ``entry``'s row into the LRU-first eligible slot not holding it."""
    eligible = (state.hot_stamp < entry.epoch) & (state.hot_protect <= group.finished_epoch)
    if bool((state.hot_rows == entry.row).any()) or not bool(eligible.any()):
        return 0
    slot = lru_order(state.hot_stamp, eligible)[0]
    dst = state.hot_locs[slot]
    for payload in group.payloads:
        payload[dst] = payload[entry.loc]
    state.hot_rows[slot] = entry.row
    state.hot_stamp[slot] = entry.epoch
    return 1
