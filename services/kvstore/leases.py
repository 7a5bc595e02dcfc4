"""Lease deadlines of histories, in wall-clock seconds (they survive a store restart).

A heap with lazy deletion: ``renew`` pushes a new entry, stale entries are skipped when
they surface, so ``pop_expired`` costs O(due · log n) and never scans every lease. Stale
entries are bounded: once they outnumber the live leases (plus a margin) the heap is
rebuilt from the live ones, amortized O(1) per renew or drop.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable

STALE_MARGIN = 1024  # heap entries beyond twice the live leases before a rebuild


class LeaseTable:
    """Deadline per key; ``renew`` moves it, ``pop_expired`` removes keys past theirs."""

    def __init__(self) -> None:
        self._deadline: dict[Hashable, float] = {}
        self._heap: list[tuple[float, int, Hashable]] = []
        self._seq = 0  # tie-breaker so keys never need comparing

    def renew(self, key: Hashable, deadline: float) -> None:
        self._deadline[key] = deadline
        self._seq += 1
        heapq.heappush(self._heap, (deadline, self._seq, key))
        self._compact()

    def deadline(self, key: Hashable) -> float:
        return self._deadline[key]

    def drop(self, key: Hashable) -> None:
        self._deadline.pop(key, None)
        self._compact()

    def _compact(self) -> None:
        """Rebuild the heap from the live deadlines once stale entries (renewed or dropped
        keys) outnumber them: a renew loop must not grow memory without bound."""
        if len(self._heap) > 2 * len(self._deadline) + STALE_MARGIN:
            self._heap = [(d, i, k) for i, (k, d) in enumerate(self._deadline.items())]
            heapq.heapify(self._heap)
            self._seq = len(self._heap)

    def pop_expired(self, now: float) -> list[Hashable]:
        """Remove and return the keys whose deadline is ``<= now``, earliest first."""
        due = []
        while self._heap and self._heap[0][0] <= now:
            deadline, _, key = heapq.heappop(self._heap)
            if self._deadline.get(key) == deadline:
                del self._deadline[key]
                due.append(key)
        return due

    def __len__(self) -> int:
        return len(self._deadline)
