"""Value types at the boundary of the residency core: specs in, grants and commands out.

Units are *pages* of the worker's configured KV pools (paper §3.1: ``M`` is the capacity
of those pools). Everything here is immutable except :class:`Ticket`, whose state the
core advances (WAITING → GRANTED | EXPIRED | CANCELLED).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from services.common.errors import ConfigError, InvalidArgument

MAX_PAGES = 1 << 40
"""Upper bound for any page count (a 2^40-page pool is far past any real device)."""


def check_pages(name: str, value: int, limit: int = MAX_PAGES, low: int = 0) -> None:
    """Raise :class:`InvalidArgument` naming ``name``, ``value`` and the allowed range."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= limit:
        raise InvalidArgument(f"{name}={value!r} out of range: expected an integer in "
                              f"{low}..{limit}")


class CommandKind(enum.Enum):
    BACKUP = "backup"      # copy the request's device-only history pages to host
    RETIRE = "retire"      # free `pages` optional pages (only after backup; I4)
    POPULATE = "populate"  # copy `pages` more history pages from host into reserved pages


class PolicyKind(enum.Enum):
    WHOLE_REQUEST = "whole-request"  # paper eq. 4: reclaim the first q requests, no more
    ELASTIC = "elastic"              # every request keeps C_base + ⌊α_t(S_i − C_base)⌋


class ReclaimOrder(enum.Enum):
    """The walk order r1, r2, … of eq. 4.

    ``backed-largest`` (default): requests whose history already has a host copy first
    (their reclaim needs no Backup: no PCIe traffic and the admission waits only for a
    Retire), then most optional pages first (so the prefix that covers Δ is short: the
    fewest requests are disturbed), ties by admission order. The paper's two costs of
    reclaim — requests disturbed and backup work on the admission's critical path — are
    exactly what this key minimises, in that priority.
    """

    BACKED_LARGEST = "backed-largest"
    LARGEST = "largest"      # most optional pages first (fewest requests disturbed)
    OLDEST = "oldest"        # least recently admitted first
    NEWEST = "newest"        # most recently admitted first (vLLM-style LIFO)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Policy knobs. ``populate_pages``/``populate_inflight`` bound the repopulation work
    per attempt and per worker; ``base_pages``/``alpha_min`` configure the elastic form
    (C_base = sink + local window, in pages); ``trace_limit`` > 0 records decisions for
    the invariant checkers (tests)."""

    policy: PolicyKind = PolicyKind.WHOLE_REQUEST
    reclaim_order: ReclaimOrder = ReclaimOrder.BACKED_LARGEST
    populate_pages: int = 16
    populate_inflight: int = 2
    alpha_min: float = 0.1
    base_pages: int = 1
    trace_limit: int = 0

    def __post_init__(self) -> None:
        if self.populate_pages < 1 or self.populate_inflight < 0:
            raise ConfigError(f"populate_pages={self.populate_pages} must be >= 1 and "
                              f"populate_inflight={self.populate_inflight} >= 0")
        if not 0.0 <= self.alpha_min <= 1.0:
            raise ConfigError(f"alpha_min={self.alpha_min} must lie in 0..1")
        if self.base_pages < 0 or self.trace_limit < 0:
            raise ConfigError(f"base_pages={self.base_pages} and "
                              f"trace_limit={self.trace_limit} must be >= 0")


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """A decode worker's pool: ``capacity_pages`` = M, ``reserve_pages`` = M_res."""

    worker_id: str
    capacity_pages: int
    reserve_pages: int = 0
    request_slots: int = 256
    address: str = ""

    def __post_init__(self) -> None:
        if not self.worker_id:
            raise InvalidArgument("worker_id='' : expected a non-empty worker id")
        check_pages("capacity_pages", self.capacity_pages, low=1)
        check_pages("reserve_pages", self.reserve_pages, limit=self.capacity_pages - 1)
        check_pages("request_slots", self.request_slots, limit=1 << 20, low=1)

    @property
    def admittable_pages(self) -> int:
        return self.capacity_pages - self.reserve_pages


@dataclass(frozen=True, slots=True)
class AdmitSpec:
    """One admission: ``required_pages`` (hot cache, tail, staging; never lent) and
    ``history_pages`` (complete pages of imported history, eligible for optional
    residency). ``worker_id`` pins the placement; empty lets the controller place."""

    request_id: str
    required_pages: int
    history_pages: int = 0
    worker_id: str = ""

    def __post_init__(self) -> None:
        if not self.request_id:
            raise InvalidArgument("request_id='' : expected a non-empty request id")
        check_pages("required_pages", self.required_pages)
        check_pages("history_pages", self.history_pages)


@dataclass(frozen=True, slots=True)
class RequestReport:
    """A worker's account of one live request (used to rebuild soft state)."""

    request_id: str
    required_pages: int
    history_pages: int
    optional_pages: int = 0   # ready optional pages on the device
    backed_pages: int = 0     # history pages with a complete host copy

    def __post_init__(self) -> None:
        if not self.request_id:
            raise InvalidArgument("request_id='' : expected a non-empty request id")
        check_pages("required_pages", self.required_pages)
        check_pages("history_pages", self.history_pages)
        check_pages("optional_pages", self.optional_pages, limit=self.history_pages)
        check_pages("backed_pages", self.backed_pages, limit=self.history_pages)
        if self.optional_pages + self.backed_pages < self.history_pages:
            raise InvalidArgument(
                f"request {self.request_id}: optional_pages={self.optional_pages} + "
                f"backed_pages={self.backed_pages} < history_pages={self.history_pages}: "
                "a history page is neither on the device nor backed (I1)")


@dataclass(frozen=True, slots=True)
class Grant:
    """An admission's outcome. The worker keeps ``optional_pages`` of the imported history
    on the device (backup deferred) and must give the other ``history_pages −
    optional_pages`` a host copy before dropping them (I1)."""

    request_id: str
    worker_id: str
    address: str
    required_pages: int
    optional_pages: int
    waited_s: float
    reclaimed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Command:
    """Work for a worker; it acknowledges ``command_id`` once the work completed."""

    command_id: int
    kind: CommandKind
    worker_id: str
    request_id: str
    pages: int


class TicketState(enum.Enum):
    WAITING = "waiting"
    GRANTED = "granted"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    FAILED = "failed"      # can never be served (``failure`` says why)


@dataclass(slots=True, eq=False)
class Ticket:
    """A pending or finished admission; ``grant`` is set once GRANTED."""

    ticket_id: int
    spec: AdmitSpec
    enqueued_at: float
    deadline: float | None
    state: TicketState = TicketState.WAITING
    grant: Grant | None = None
    pledged_worker: str | None = None   # worker reclaiming pages for this ticket
    reclaimed: tuple[str, ...] = ()
    failure: Exception | None = None    # set when FAILED: the error its caller gets
