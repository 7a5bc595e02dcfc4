"""Bounded speculative storage, in bytes (paper §3.4, eq. 9).

    R_d     = p · ceil((W + p − 1 + K_max) / p)        draft ring rows per request slot
    ring    = N · R_d · d_draft                          d_draft: bytes of one ring row over
                                                         all draft K/V allocations
    M_stage = χ · N · K_max · k · d_KV                   χ payload sources live at once

Paper check (GLM-5.3 / DFlash2): W = 2048, p = 64, K_max = 8 → R_d = 2176; 12 K/V
allocations totalling 12,288 B per row at N = 35 → 0.87 GiB; χ = 4, k = 2048,
d_KV = 576 B at N = 35 → 1.23 GiB of staging.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.errors import InvalidArgument


def _positive(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InvalidArgument(f"{name}={v!r} must be an integer >= 1")


def ring_rows(window: int, page: int, k_max: int) -> int:
    """``R_d`` of eq. 9: the window, one block and page alignment, rounded up to pages."""
    _positive(window=window, page=page, k_max=k_max)
    return page * -(-(window + page - 1 + k_max) // page)


def ring_bytes(window: int, page: int, k_max: int, draft_row_bytes: int,
               slots: int = 1) -> int:
    """Draft ring bytes for ``slots`` request slots; independent of context length."""
    _positive(draft_row_bytes=draft_row_bytes, slots=slots)
    return slots * ring_rows(window, page, k_max) * draft_row_bytes


def staging_bytes(live_sources: int, slots: int, k_max: int, top_k: int,
                  row_bytes: int) -> int:
    """``M_stage = χ · N · K_max · k · d_KV`` (one arena per live payload source)."""
    _positive(live_sources=live_sources, slots=slots, k_max=k_max, top_k=top_k,
              row_bytes=row_bytes)
    return live_sources * slots * k_max * top_k * row_bytes


@dataclass(frozen=True, slots=True)
class SpecMemory:
    """Speculative bytes of one decode worker with ``slots`` request slots."""

    slots: int
    ring_rows: int
    ring_bytes_per_session: int
    staging_bytes_per_session: int

    @property
    def per_session(self) -> int:
        return self.ring_bytes_per_session + self.staging_bytes_per_session

    @property
    def ring_bytes(self) -> int:
        return self.slots * self.ring_bytes_per_session

    @property
    def staging_bytes(self) -> int:
        return self.slots * self.staging_bytes_per_session

    @property
    def per_worker(self) -> int:
        return self.ring_bytes + self.staging_bytes


def spec_memory(*, window: int, page: int, k_max: int, draft_row_bytes: int,
                live_sources: int, slots: int, top_k: int, row_bytes: int) -> SpecMemory:
    """Ring + staging accounting per session and per worker (eq. 9 and §3.4)."""
    return SpecMemory(
        slots=slots,
        ring_rows=ring_rows(window, page, k_max),
        ring_bytes_per_session=ring_bytes(window, page, k_max, draft_row_bytes),
        staging_bytes_per_session=staging_bytes(live_sources, 1, k_max, top_k, row_bytes),
    )
