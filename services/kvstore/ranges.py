"""Sets of half-open row ranges ``[start, stop)``, kept sorted, disjoint and coalesced.

::

    rows   0    4    8    12   16
           |####|    |#########|      RangeSet([(0, 4), (8, 16)])
    add(4, 8) -> [(0, 16)]            adjacent ranges merge
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator


class RangeSet:
    """Sorted, disjoint, coalesced ``[start, stop)`` ranges over non-negative integers."""

    __slots__ = ("_starts", "_stops")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._stops: list[int] = []
        for start, stop in ranges:
            self.add(start, stop)

    def add(self, start: int, stop: int) -> None:
        """Union ``[start, stop)`` into the set (empty ranges are ignored)."""
        if stop <= start:
            return
        # First range whose stop >= start (could merge) and last whose start <= stop.
        lo = bisect.bisect_left(self._stops, start)
        hi = bisect.bisect_right(self._starts, stop)
        if lo < hi:
            start = min(start, self._starts[lo])
            stop = max(stop, self._stops[hi - 1])
        self._starts[lo:hi] = [start]
        self._stops[lo:hi] = [stop]

    def covers(self, start: int, stop: int) -> bool:
        """True when every row of ``[start, stop)`` is in the set (empty range: True)."""
        if stop <= start:
            return True
        i = bisect.bisect_right(self._starts, start) - 1
        return i >= 0 and self._stops[i] >= stop

    def intersects(self, start: int, stop: int) -> bool:
        """True when some row of ``[start, stop)`` is in the set."""
        if stop <= start:
            return False
        i = bisect.bisect_right(self._starts, stop - 1) - 1
        return i >= 0 and self._stops[i] > start

    def count(self) -> int:
        """Number of rows in the set."""
        return sum(b - a for a, b in zip(self._starts, self._stops, strict=True))

    def copy(self) -> RangeSet:
        out = RangeSet()
        out._starts = list(self._starts)
        out._stops = list(self._stops)
        return out

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._starts, self._stops, strict=True))

    def __len__(self) -> int:
        return len(self._starts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangeSet) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"RangeSet({list(self)})"
