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

Promotion (``promotion.py``) is deterministic: requests in acquisition order, each
request's staged rows in acquisition order (ascending source row within one resolve),
victim slots by (stamp, slot index) ascending among slots whose stamp is older than the
staged row's epoch and that do not already hold the row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.common.errors import FailedPrecondition, ResourceExhausted


@dataclass(frozen=True, slots=True)
class StagedRow:
    request_id: str
    row: int  # source row index
    loc: int  # pool row in the arena
    epoch: int  # resolve that staged it
    owner: str = ""  # source group that staged it (shared arenas)


@dataclass(frozen=True, slots=True)
class StagedBlock:
    """One acquisition: a resolve's staged rows of one request (ascending source rows)."""

    request_id: str
    epoch: int
    owner: str
    rows: torch.Tensor  # int64 [n] (CPU) source rows
    locs: torch.Tensor  # int64 [n] (CPU) arena rows, in the same order


class StagingArena:
    """Pool rows ``base_row .. base_row + capacity - 1``: a FIFO free queue (acquire takes
    from its head, release appends at its tail) and the staged rows as blocks in
    acquisition order. Kept in tensors, not per row: a speculative round can stage
    thousands of rows per request, and per-row Python objects cost seconds per round."""

    def __init__(self, base_row: int, capacity: int) -> None:
        self.base_row = base_row
        self.capacity = capacity
        self._ring = torch.arange(base_row, base_row + capacity, dtype=torch.int64)
        self._head = 0
        self._free = capacity
        self.blocks: list[StagedBlock] = []

    # -- free queue ---------------------------------------------------------------------------
    def _span(self, start: int, n: int) -> torch.Tensor:
        """Ring positions ``start .. start + n - 1`` (wrapping)."""
        return (start + torch.arange(n)) % max(self.capacity, 1)

    def _take(self, n: int) -> torch.Tensor:
        out = self._ring[self._span(self._head, n)]
        self._head = (self._head + n) % max(self.capacity, 1)
        self._free -= n
        return out

    def _give(self, locs: torch.Tensor) -> None:
        self._ring[self._span(self._head + self._free, locs.numel())] = locs
        self._free += locs.numel()

    @property
    def free_locs(self) -> list[int]:
        """Free arena rows in queue order (a copy)."""
        return self._ring[self._span(self._head, self._free)].tolist()

    def can_acquire(self, n: int) -> bool:
        return n <= self._free

    # -- staged rows ----------------------------------------------------------------------------
    def acquire(self, request_id: str, rows: Sequence[int] | torch.Tensor, epoch: int,
                owner: str = "") -> torch.Tensor:
        """Stage ``rows`` (one resolve, one request); returns their arena rows (CPU int64)."""
        rows = torch.as_tensor(rows, dtype=torch.int64).cpu().flatten()
        if not self.can_acquire(rows.numel()):
            raise ResourceExhausted(
                f"staging rows={rows.numel()} exceed the free staging rows={self._free} "
                f"(staging_rows={self.capacity}); release staging or raise staging_rows"
            )
        locs = self._take(rows.numel())
        if rows.numel():
            self.blocks.append(StagedBlock(request_id, epoch, owner, rows, locs))
        return locs

    def owned(self, owner: str | None = None) -> list[StagedBlock]:
        return [b for b in self.blocks if owner is None or b.owner == owner]

    def entries(self, owner: str | None = None) -> list[StagedRow]:
        """Staged rows in acquisition order (of one owner, or all): one object per row,
        for checks and tests."""
        return [StagedRow(b.request_id, r, loc, b.epoch, b.owner)
                for b in self.owned(owner)
                for r, loc in zip(b.rows.tolist(), b.locs.tolist(), strict=True)]

    @property
    def staged(self) -> dict[int, StagedRow]:
        """loc -> staged row, in acquisition order (a copy)."""
        return {e.loc: e for e in self.entries()}

    def latest_epoch(self, owner: str | None = None) -> int:
        """Epoch of the newest staged rows (of ``owner``, or all); 0 when none."""
        return max((b.epoch for b in self.owned(owner)), default=0)

    @property
    def max_epoch(self) -> int:
        return self.latest_epoch()

    def release(self, finished_epoch: int, owner: str | None = None) -> list[StagedBlock]:
        """Free the staged rows (of ``owner``); FailedPrecondition while readers run."""
        busy = self.latest_epoch(owner)
        if busy > finished_epoch:
            raise FailedPrecondition(
                f"staged rows of epoch={busy} still have readers "
                f"(finished_epoch={finished_epoch}); call readers_finished first"
            )
        return self._drop(self.owned(owner))

    def drop_request(self, request_id: str, owner: str | None = None) -> None:
        """Free the rows of a released request (its readers finished)."""
        self._drop([b for b in self.owned(owner) if b.request_id == request_id])

    def _drop(self, blocks: list[StagedBlock]) -> list[StagedBlock]:
        if blocks:
            gone = {id(b) for b in blocks}
            self.blocks = [b for b in self.blocks if id(b) not in gone]
            self._give(torch.cat([b.locs for b in blocks]))
        return blocks

    def all_locs(self) -> list[int]:
        """Every arena row, free or staged (by any owner): the I6 balance check."""
        return self.free_locs + [loc for b in self.blocks for loc in b.locs.tolist()]


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
    def free_locs(self) -> list[int]:
        return self.arena.free_locs

    @property
    def staged(self) -> dict[int, StagedRow]:
        return {e.loc: e for e in self.arena.entries(self.owner)}

    def can_acquire(self, n: int) -> bool:
        return self.arena.can_acquire(n)

    def acquire(self, request_id: str, rows: Sequence[int] | torch.Tensor,
                epoch: int) -> torch.Tensor:
        return self.arena.acquire(request_id, rows, epoch, self.owner)

    def entries(self) -> list[StagedRow]:
        return self.arena.entries(self.owner)

    @property
    def max_epoch(self) -> int:
        return self.arena.latest_epoch(self.owner)

    def release(self, finished_epoch: int) -> list[StagedBlock]:
        return self.arena.release(finished_epoch, self.owner)

    def drop_request(self, request_id: str) -> None:
        self.arena.drop_request(request_id, self.owner)

    def all_locs(self) -> list[int]:
        return self.arena.all_locs()
