"""The draft KV ring (paper eq. 9–10): bounded draft state, rollback by pointer move.

::

    slot i:  [ i·R_d ............................ (i+1)·R_d )
                   ^ φ(i, t) = i·R_d + (t mod R_d)
    live positions of slot i:  max(base, high − R_d) <= t < frontier

``frontier`` is the next position to write (rows below it are the drafter's state);
``high`` is the highest position ever written + 1, so rows older than ``high − R_d`` are
known overwritten; ``base`` is where the slot's history starts (``jump``: a drafter that
catches up on a long prompt starts near its end instead of at position 0). Rollback sets
``frontier`` back (no copy, no allocation, no free). With
``R_d >= W + K_max`` (eq. 9), a round writing at most ``K_max`` rows past the committed
frontier never overwrites a row of the window ``[t − W + 1, t]`` it reads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.common.errors import InvalidArgument
from services.decode.spec.memory import ring_rows


class DraftRing:
    """``slots`` request slots of ``R_d`` rows of shape ``row_shape`` (``dtype``)."""

    def __init__(self, slots: int, window: int, page: int, k_max: int,
                 row_shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> None:
        self.rows_per_slot = ring_rows(window, page, k_max)
        if slots < 1:
            raise InvalidArgument(f"slots={slots} must be >= 1")
        self.slots, self.window, self.page, self.k_max = slots, window, page, k_max
        self.storage = torch.zeros(slots * self.rows_per_slot, *row_shape, dtype=dtype,
                                   device=device)
        self._frontier = [0] * slots
        self._high = [0] * slots
        self._base = [0] * slots

    # -- addressing ---------------------------------------------------------------------
    def address(self, slot: int, t: torch.Tensor | int) -> torch.Tensor | int:
        """``φ(i, t) = i·R_d + (t mod R_d)`` (eq. 10), for an int or an int64 tensor."""
        return slot * self.rows_per_slot + t % self.rows_per_slot

    def frontier(self, slot: int) -> int:
        return self._frontier[self._check_slot(slot)]

    def pointer_state(self, slot: int) -> tuple[int, int, int]:
        """``(frontier, high, base)`` of ``slot``."""
        return self._frontier[self._check_slot(slot)], self._high[slot], self._base[slot]

    def live(self, slot: int) -> range:
        """Positions whose rows are readable now."""
        f, h, b = self.pointer_state(slot)
        return range(min(f, max(b, h - self.rows_per_slot)), f)

    def window_positions(self, slot: int, t: int) -> range:
        """Positions read at position ``t``: ``max(base, t − W + 1) .. t``."""
        return range(max(self._base[self._check_slot(slot)], t - self.window + 1), t + 1)

    # -- state changes ------------------------------------------------------------------
    def write(self, slot: int, start: int, rows: torch.Tensor) -> None:
        """Store ``rows [c, *row_shape]`` at positions ``start .. start+c-1``.

        ``start <= frontier`` (no gap) and ``c <= R_d − W`` (a chunk never evicts the
        window of its own first position). Sets ``frontier = start + c``.
        """
        c = int(rows.shape[0])
        self._check_write(slot, start, c)
        pos = torch.arange(start, start + c, device=self.storage.device)
        self.storage[self.address(slot, pos)] = rows
        self._advance(slot, start + c)

    def write_many(self, slots: Sequence[int], starts: Sequence[int], counts: Sequence[int],
                   addresses: torch.Tensor, rows: torch.Tensor) -> None:
        """``write`` for several distinct slots in one indexed copy: ``addresses [N]`` are
        the ring rows of every item's positions (item order), ``rows [N, ...]`` their
        values. Every item is checked before anything is written."""
        if len(set(slots)) != len(slots):
            raise InvalidArgument(f"slots={list(slots)} must be distinct")
        for slot, start, count in zip(slots, starts, counts, strict=True):
            self._check_write(slot, start, count)
        self.storage[addresses] = rows
        for slot, start, count in zip(slots, starts, counts, strict=True):
            self._advance(slot, start + count)

    def _check_write(self, slot: int, start: int, count: int) -> None:
        f = self.frontier(slot)
        if start < self._base[slot] or start > f:
            raise InvalidArgument(f"start={start} must be in base={self._base[slot]}.."
                                  f"frontier={f}")
        if count > self.rows_per_slot - self.window:
            raise InvalidArgument(f"rows={count} must be <= R_d - W = "
                                  f"{self.rows_per_slot - self.window}")

    def _advance(self, slot: int, frontier: int) -> None:
        self._frontier[slot] = frontier
        self._high[slot] = max(self._high[slot], frontier)

    def read(self, slot: int, positions: torch.Tensor) -> torch.Tensor:
        """Rows of live ``positions int64 [n]`` → ``[n, *row_shape]`` (a copy)."""
        live = self.live(slot)
        if positions.numel() and (int(positions.min()) < live.start
                                  or int(positions.max()) >= live.stop):
            raise InvalidArgument(f"positions {positions.min()}..{positions.max()} must be "
                                  f"live ({live.start}..{live.stop - 1})")
        return self.storage[self.address(slot, positions)]

    def rollback(self, slot: int, n: int) -> None:
        """Keep positions ``< n`` (the committed prefix): ``frontier = min(frontier, n)``."""
        if n < self._base[self._check_slot(slot)]:
            raise InvalidArgument(f"n={n} must be >= base={self._base[slot]}")
        self._frontier[slot] = min(self._frontier[slot], n)

    def reset(self, slot: int, base: int = 0) -> None:
        """Start the slot's history at position ``base`` (pointers only; no free)."""
        if base < 0:
            raise InvalidArgument(f"base={base} must be >= 0")
        self._check_slot(slot)
        self._frontier[slot] = self._high[slot] = self._base[slot] = base

    def _check_slot(self, slot: int) -> int:
        if not 0 <= slot < self.slots:
            raise InvalidArgument(f"slot={slot} must be in 0..{self.slots - 1}")
        return slot

    @property
    def nbytes(self) -> int:
        """Device bytes of the ring (eq. 9 × row bytes × slots)."""
        return self.storage.numel() * self.storage.element_size()
