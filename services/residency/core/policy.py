"""Pure policy functions: reclaim order, eq. 4 selection, elastic targets, placement.

No state lives here; :class:`services.residency.core.residency.ResidencyCore` applies
the decisions to the ledgers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from services.residency.core.ledger import RequestEntry, WorkerLedger
from services.residency.core.model import ReclaimOrder


def reclaim_key(entry: RequestEntry, order: ReclaimOrder) -> tuple[int, ...]:
    """Sort key of the reclaim walk r1, r2, … (smaller first); see :class:`ReclaimOrder`."""
    if order is ReclaimOrder.BACKED_LARGEST:
        return (0 if entry.fully_backed else 1, -entry.allocated, entry.seq)
    if order is ReclaimOrder.LARGEST:
        return (-entry.allocated, entry.seq)
    if order is ReclaimOrder.OLDEST:
        return (entry.seq,)
    return (-entry.seq,)


def reclaim_candidates(worker: WorkerLedger, order: ReclaimOrder) -> list[RequestEntry]:
    """Requests whose optional pages may be reclaimed now, in reclaim order."""
    idle = [e for e in worker.requests.values() if not e.busy and e.allocated > 0]
    return sorted(idle, key=lambda e: reclaim_key(e, order))


def select_eq4(pages: Sequence[int], deficit: int) -> int | None:
    """Paper eq. 4: the smallest q with ``sum(pages[:q]) >= deficit``; None if no prefix
    covers the deficit (the admission then waits). ``deficit <= 0`` needs q = 0."""
    total = 0
    for q in range(len(pages) + 1):
        if total >= deficit:
            return q
        if q < len(pages):
            total += pages[q]
    return None


def elastic_alpha(required: int, capacity: int, reserve: int, alpha_min: float) -> float:
    """α_t = clamp(1 − M_alloc / (M_cap − M_res), α_min, 1), with M_alloc the pages held
    by required allocations (optional history is what α sizes, so it is not counted)."""
    usable = capacity - reserve
    alpha = 1.0 - required / usable if usable > 0 else 0.0
    return min(1.0, max(alpha_min, alpha))


def elastic_target(history: int, base: int, alpha: float) -> int:
    """Pages a request keeps resident: C_base + ⌊α·(S_i − C_base)⌋, capped by S_i."""
    if history <= base:
        return history
    return base + math.floor(alpha * (history - base))


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an admission goes. ``deficit`` = pages still to reclaim beyond free and
    incoming pages (0: it fits now, or once in-flight reclaims land)."""

    worker: WorkerLedger
    fits_now: bool
    deficit: int


def place(workers: Iterable[WorkerLedger], required: int, pinned: str,
          reclaimable: Callable[[WorkerLedger], int]) -> Placement | None:
    """Pick the worker for an admission of ``required`` pages.

    Rule: only workers with a free request slot whose ``free + incoming + reclaimable``
    covers ``required``. Prefer a worker where it fits in free pages (nobody is
    disturbed); among equals, the most headroom (``free + incoming + reclaimable``: the
    most room left for optional history, and under pressure the cheapest reclaim),
    then the fewest active requests, then the smallest worker id. ``pinned`` restricts
    the choice to that worker. None: no worker can host it now (the admission waits).
    """
    best: tuple[tuple[object, ...], Placement] | None = None
    for w in workers:
        if (pinned and w.worker_id != pinned) or w.free_slots <= 0:
            continue
        free, incoming = w.free_pages, w.incoming_pages
        fits_now = required <= free
        deficit = max(0, required - free - incoming)
        room = free + incoming
        if not fits_now:
            room += reclaimable(w)
            if room < required:
                continue
        key = (not fits_now, -room, len(w.requests), w.worker_id)
        if best is None or key < best[0]:
            best = (key, Placement(w, fits_now, deficit))
    return None if best is None else best[1]
