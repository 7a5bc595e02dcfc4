"""Page allocator of one source group's device pool.

A page is ``page_rows`` consecutive pool rows: page ``g`` covers pool rows
``g*p .. g*p+p-1``. Every page is in exactly one state::

    free ──allocate(n, "required")──> required   (hot cache, tail, resident history)
    free ──allocate(n, "optional")──> optional   (reclaimable imported history)
    any allocated ──free(pages)──> free

``reserve_pages`` free pages are never handed out, so
``required + optional + reserve <= num_pages`` holds at all times (I2, paper eq. 3).
The free list is a plain deque: pages are freed by id and re-used FIFO, which keeps the
allocation order deterministic for tests and kernels.
"""

from __future__ import annotations

from collections import deque

from services.common.errors import InvalidArgument, ResourceExhausted

PAGE_KINDS = ("required", "optional")


class PagePool:
    """Free list and ownership kind of ``num_pages`` pages."""

    def __init__(self, num_pages: int, reserve_pages: int, first_id: int = 0) -> None:
        self.num_pages = num_pages
        self.reserve_pages = reserve_pages
        self.first_id = first_id  # groups sharing one tensor own disjoint id ranges
        self.free_ids: deque[int] = deque(range(first_id, first_id + num_pages))
        self.kind: dict[int, str] = {}

    @property
    def available(self) -> int:
        """Pages that may be allocated now (free minus the reserve)."""
        return max(0, len(self.free_ids) - self.reserve_pages)

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= self.available

    def allocate(self, n: int, kind: str) -> list[int]:
        """Take ``n`` pages (FIFO from the free list); ResourceExhausted when they do not fit."""
        if kind not in PAGE_KINDS:
            raise InvalidArgument(f"kind={kind!r} must be one of {PAGE_KINDS}")
        if not self.can_allocate(n):
            raise ResourceExhausted(
                f"pages={n} exceed the available pages={self.available} "
                f"(free={len(self.free_ids)}, reserve={self.reserve_pages})"
            )
        pages = [self.free_ids.popleft() for _ in range(n)]
        for page in pages:
            self.kind[page] = kind
        return pages

    def free(self, pages: list[int]) -> None:
        for page in pages:
            if page not in self.kind:
                raise InvalidArgument(f"page={page} is not allocated (double free)")
        for page in pages:
            del self.kind[page]
            self.free_ids.append(page)

    def give_back(self, pages: list[int]) -> None:
        """Undo the latest ``allocate`` calls that returned ``pages`` (in allocation order):
        they return to the front of the free list, which is then as before them."""
        for page in pages:
            if page not in self.kind:
                raise InvalidArgument(f"page={page} is not allocated (double free)")
        for page in reversed(pages):
            del self.kind[page]
            self.free_ids.appendleft(page)

    def count(self, kind: str) -> int:
        return sum(1 for k in self.kind.values() if k == kind)

    def counts(self) -> dict[str, int]:
        """Pages by state, the keys of the ``dhisparse_pages{kind=...}`` gauge."""
        return {
            "required": self.count("required"),
            "optional": self.count("optional"),
            "free": len(self.free_ids),
            "reserve": self.reserve_pages,
        }
