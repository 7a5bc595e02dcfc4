"""Per-worker page ledger: who holds which pages of one decode worker's KV pools.

::

    |<------------------------------- M (capacity) ------------------------------->|
    | required (hot cache, tail) | optional history (allocated ⊇ ready) | free | M_res |
                                   ^ reclaimable: moves with load

Invariant I2 (paper eq. 3): ``required + allocated + reserve ≤ capacity``. The ledger
keeps running sums; :mod:`services.residency.core.invariants` recomputes them. All
mutation goes through the methods below, which assume the caller validated first.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.residency.core.model import WorkerSpec


@dataclass(slots=True, eq=False)
class RequestEntry:
    """One admitted request. ``allocated`` = a_r (optional pages held, including pages
    reserved by an in-flight Populate); ``ready`` ≤ allocated are published to the
    resolver; ``backed`` history pages have a host copy. I1: ready + backed ≥ history."""

    request_id: str
    worker_id: str
    required: int
    history: int
    allocated: int
    ready: int
    backed: int
    seq: int                      # admission order, monotone over the core's life
    pending: int | None = None    # id of the one in-flight command, if any
    retire_pages: int = 0         # > 0: selected for reclaim (Backup then Retire)

    @property
    def fully_backed(self) -> bool:
        return self.backed >= self.history

    @property
    def busy(self) -> bool:
        """In a command or a reclaim: not a reclaim or populate candidate."""
        return self.pending is not None or self.retire_pages > 0


class WorkerLedger:
    """Pages and request slots of one worker; requests in admission order."""

    __slots__ = (
        "allocated",
        "history",
        "last_seen",
        "populate_cursor",
        "populated_total",
        "populating",
        "ready",
        "reclaimed_total",
        "requests",
        "required",
        "spec",
    )

    def __init__(self, spec: WorkerSpec, now: float) -> None:
        self.spec = spec
        self.requests: dict[str, RequestEntry] = {}
        self.required = 0
        self.allocated = 0
        self.ready = 0
        self.history = 0
        self.last_seen = now
        self.reclaimed_total = 0
        self.populated_total = 0
        self.populate_cursor = -1      # seq of the request populated last (round robin)
        self.populating = 0            # Populate commands in flight

    @property
    def worker_id(self) -> str:
        return self.spec.worker_id

    @property
    def free_pages(self) -> int:
        """Pages neither held nor reserved: M − M_req − M_opt − M_res."""
        return self.spec.admittable_pages - self.required - self.allocated

    @property
    def free_slots(self) -> int:
        return self.spec.request_slots - len(self.requests)

    @property
    def incoming_pages(self) -> int:
        """Pages that in-flight reclaims (Backup → Retire) will free."""
        return sum(e.retire_pages for e in self.requests.values())

    @property
    def coverage(self) -> float:
        """Ready optional history / eligible history (1.0 when there is none)."""
        return self.ready / self.history if self.history else 1.0

    def add(self, entry: RequestEntry) -> None:
        self.requests[entry.request_id] = entry
        self.required += entry.required
        self.allocated += entry.allocated
        self.ready += entry.ready
        self.history += entry.history

    def remove(self, request_id: str) -> RequestEntry:
        entry = self.requests.pop(request_id)
        self.required -= entry.required
        self.allocated -= entry.allocated
        self.ready -= entry.ready
        self.history -= entry.history
        return entry

    def reserve_optional(self, entry: RequestEntry, pages: int) -> None:
        """Populate, step 1: reserve pages (not yet ready)."""
        entry.allocated += pages
        self.allocated += pages

    def unreserve(self, entry: RequestEntry, pages: int) -> None:
        """Populate failed: the reserved pages return to the free pool."""
        entry.allocated -= pages
        self.allocated -= pages

    def publish(self, entry: RequestEntry, pages: int) -> None:
        """Populate, step 3: the copy completed; pages become ready."""
        entry.ready += pages
        self.ready += pages
        self.populated_total += pages

    def retire(self, entry: RequestEntry, pages: int) -> None:
        """Reclaim, last step: ready pages return to the free pool."""
        entry.allocated -= pages
        entry.ready -= pages
        self.allocated -= pages
        self.ready -= pages
        self.reclaimed_total += pages
