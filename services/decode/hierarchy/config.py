"""Configuration of the decode KV hierarchy: page geometry, tier sizes and the policy.

``HierarchyConfig`` is per decode worker and shared by every source group;
``SourceSpec`` describes one source group (its payload layers and row size).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.common.errors import InvalidArgument

POLICIES = ("resident", "hisparse", "adaptive")
"""``resident``: all history on the device, no host backing, no hot cache.
``hisparse``: hot cache + host backing, no optional residency.
``adaptive``: hot cache + host backing + resident-first optional residency.
(The speculative policies of DESIGN.md §6 use the same hierarchy settings.)"""


def is_int(value: object) -> bool:
    """An int that is not a bool (``True`` would pass ``isinstance(value, int)``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(name: str, value: int, minimum: int = 1) -> None:
    if not is_int(value) or value < minimum:
        raise InvalidArgument(f"{name}={value!r} must be an integer >= {minimum}")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def completed_rows(positions: int, positions_per_row: int = 1) -> int:
    """Source rows fully completed by ``positions`` token positions (paper eq. 8).

    A source that packs ``m = positions_per_row`` consecutive positions per stored row has
    rows ``0 .. positions // m - 1`` complete; the incomplete group stays in the tail.
    This is the one place where positions turn into rows.
    """
    _positive("positions_per_row", positions_per_row)
    if positions < 0:
        raise InvalidArgument(f"positions={positions} must be >= 0")
    return positions // positions_per_row


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One source group: ``payload_layers`` payload tensors of ``row_bytes``-byte rows.

    GLM-like: one index producer whose selection several follower layers share, each with
    its own bytes -> ``payload_layers = number of followers``.
    DeepSeek-like: one shared payload read by several layers -> ``payload_layers = 1``.
    """

    name: str
    row_bytes: int
    payload_layers: int = 1

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidArgument("name='' must be a non-empty source group name")
        _positive("row_bytes", self.row_bytes)
        _positive("payload_layers", self.payload_layers)


@dataclass(frozen=True, slots=True)
class HierarchyConfig:
    """Tier sizes of one decode worker (per source group, all counts in rows or pages).

    page_rows      p: rows per page (allocation granule of the device pool)
    hot_slots      B: hot-cache rows per request (LRU); required memory
                   (and, with B > 0, hot_index: 8 bytes per history row of the request,
                   outside the pool; the CUDA lookup's row -> slot index, request.py; and
                   hot_rank, its cache for the rank form: 8 bytes per slot and 1.5 bits per
                   history row: a bitmap bit and a u16 prefix per 32 rows)
    tail_rows      T: tail ring rows per request, >= p + K_max - 1; required memory
    num_pages      M: pages of the device pool (per source group)
    reserve_pages  M_res: pages never handed out (admission reserve, eq. 3)
    staging_rows   overflow arena rows per source group (paper: N * K_max * k)
    max_requests   N: request slots
    """

    num_pages: int
    page_rows: int = 64
    hot_slots: int = 2048
    tail_rows: int = 72
    reserve_pages: int = 0
    staging_rows: int = 0
    max_requests: int = 64
    policy: str = "adaptive"
    device: str = "cpu"

    def __post_init__(self) -> None:
        _positive("num_pages", self.num_pages)
        _positive("page_rows", self.page_rows)
        _positive("hot_slots", self.hot_slots)
        _positive("tail_rows", self.tail_rows, self.page_rows)
        _positive("reserve_pages", self.reserve_pages, 0)
        _positive("staging_rows", self.staging_rows, 0)
        _positive("max_requests", self.max_requests)
        if self.reserve_pages >= self.num_pages:
            raise InvalidArgument(
                f"reserve_pages={self.reserve_pages} must be < num_pages={self.num_pages}"
            )
        if self.policy not in POLICIES:
            raise InvalidArgument(f"policy={self.policy!r} must be one of {POLICIES}")
        try:
            torch.device(self.device)
        except RuntimeError as exc:
            raise InvalidArgument(f"device={self.device!r} is not a torch device") from exc

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def offloads(self) -> bool:
        """True when history is backed on host and served through a hot cache."""
        return self.policy != "resident"

    @property
    def pool_rows(self) -> int:
        """Rows of each payload tensor: the pages, then the staging arena."""
        return self.num_pages * self.page_rows + self.staging_rows

    @property
    def required_pages(self) -> int:
        """Pages a request holds from admission to release (hot cache + tail)."""
        hot = ceil_div(self.hot_slots, self.page_rows) if self.offloads else 0
        return hot + ceil_div(self.tail_rows, self.page_rows)
