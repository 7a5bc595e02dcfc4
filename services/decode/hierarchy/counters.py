"""Resolver counters: where each selected row was found and what the host path cost.

Maps onto the metrics ``dhisparse_selected_rows_total{source=...}`` and
``dhisparse_host_fetch_bytes_total`` (the metrics module reads these fields).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(slots=True)
class SelectionCounts:
    """Counts of one resolve call, or cumulative over a source group.

    tail / optional / hot / host: selection entries (not distinct rows; padding excluded)
    resolved in the tail, the ready optional map, the hot cache, or copied from host
    (to a hot slot or the staging arena).
    host_rows: distinct rows copied from host (once per request and row, eq. 6).
    host_bytes: bytes copied from host, over every payload layer the plan was applied to.
    staged_rows: of host_rows, those placed in the staging arena.
    lookups / direct_lookups: per-request lookups, and those wholly resolved in step 1.
    """

    tail: int = 0
    optional: int = 0
    hot: int = 0
    host: int = 0
    host_rows: int = 0
    host_bytes: int = 0
    staged_rows: int = 0
    lookups: int = 0
    direct_lookups: int = 0

    def add(self, other: SelectionCounts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def selected(self) -> int:
        return self.tail + self.optional + self.hot + self.host

    @property
    def host_fetch_share(self) -> float:
        """Share of selections served from host (``dhisparse_host_fetch_share``)."""
        return self.host / self.selected if self.selected else 0.0
