"""Lease deadlines of histories, in wall-clock seconds (they survive a store restart).

A heap with lazy deletion: ``renew`` pushes a new entry, stale entries are skipped when
they surface, so ``pop_expired`` costs O(due · log n) and never scans every lease.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable


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

    def deadline(self, key: Hashable) -> float:
        return self._deadline[key]

    def drop(self, key: Hashable) -> None:
        self._deadline.pop(key, None)

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
