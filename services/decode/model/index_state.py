"""Index state: per request slot and group, the indexer keys of every position (on device).

Never offloaded (DESIGN.md §1). Keys are stored encoded (``uint8 [n, index_key_bytes]``)
in a per-(slot, group) buffer that grows by doubling. A forward pass writes the keys of
its current block at positions ``n .. n + K_r - 1``; after acceptance the engine calls
``truncate(slot, n')`` — a length move — so rejected keys are never scored again.
"""

from __future__ import annotations

import torch

from services.common.errors import InvalidArgument, NotFound


class IndexState:
    def __init__(self, groups: int, key_bytes: int, device: str | torch.device = "cpu",
                 initial_capacity: int = 64) -> None:
        self.groups = groups
        self.key_bytes = key_bytes
        self.device = torch.device(device)
        self._initial = initial_capacity
        self._buf: dict[int, list[torch.Tensor]] = {}
        self._len: dict[int, list[int]] = {}

    def open(self, slot: int) -> None:
        """Start an empty key history for ``slot`` (replacing any previous one)."""
        self._buf[slot] = [torch.zeros(self._initial, self.key_bytes, dtype=torch.uint8,
                                       device=self.device) for _ in range(self.groups)]
        self._len[slot] = [0] * self.groups

    def close(self, slot: int) -> None:
        self._require(slot)
        del self._buf[slot], self._len[slot]

    def _require(self, slot: int) -> None:
        if slot not in self._buf:
            raise NotFound(f"slot={slot} has no index state (open it first)")

    def length(self, slot: int, group: int = 0) -> int:
        self._require(slot)
        return self._len[slot][group]

    def write(self, slot: int, group: int, start: int, keys: torch.Tensor) -> None:
        """Store ``keys uint8 [n, key_bytes]`` at positions ``start .. start+n-1``."""
        self._require(slot)
        if start > self._len[slot][group]:
            raise InvalidArgument(f"start={start} leaves a gap after "
                                  f"length={self._len[slot][group]}")
        stop = start + keys.shape[0]
        buf = self._buf[slot][group]
        if stop > buf.shape[0]:
            grown = torch.zeros(max(stop, 2 * buf.shape[0]), self.key_bytes,
                                dtype=torch.uint8, device=self.device)
            grown[: buf.shape[0]] = buf
            self._buf[slot][group] = buf = grown
        buf[start:stop] = keys
        self._len[slot][group] = stop

    def keys(self, slot: int, group: int, stop: int) -> torch.Tensor:
        """Encoded keys of positions ``0 .. stop-1``: ``uint8 [stop, key_bytes]`` (a view)."""
        self._require(slot)
        if stop > self._len[slot][group]:
            raise InvalidArgument(f"stop={stop} exceeds length={self._len[slot][group]}")
        return self._buf[slot][group][:stop]

    def truncate(self, slot: int, n: int) -> None:
        """Drop keys of positions ``>= n`` (rollback after rejection: no copy, no free)."""
        self._require(slot)
        self._len[slot] = [min(length, n) for length in self._len[slot]]

    def export(self, slot: int, n: int) -> list[torch.Tensor]:
        """Copies of the first ``n`` keys per group (for a prepared prefix)."""
        return [self.keys(slot, g, n).clone() for g in range(self.groups)]

    def import_keys(self, slot: int, keys: list[torch.Tensor]) -> None:
        """Open ``slot`` with a prepared prefix's keys (``keys[g] uint8 [T, key_bytes]``)."""
        self.open(slot)
        for g, k in enumerate(keys):
            self.write(slot, g, 0, k.to(self.device))

    def nbytes(self, slot: int) -> int:
        """Device bytes of the keys held for ``slot`` (lengths, not buffer capacity)."""
        self._require(slot)
        return sum(self._len[slot]) * self.key_bytes
