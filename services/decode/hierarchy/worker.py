"""All source groups of one decode worker, with admission and release across them.

An engine holds one ``Hierarchy``; each KV source group is resolved separately
(``resolve(h.group(name), ...)``), but a request is admitted to and released from every
group at once: either it is admitted everywhere or nowhere.

When the groups have the same shape (row bytes, payload layers) they share one staging
arena (paper §3.4: ``M_stage = χ·N·K_max·k·d_KV`` for the χ payload sources live at
once, not one arena per group): payload layer m of every group lives in one tensor,
``[ staging | pages of group 0 | pages of group 1 | ... ]``, and each group sees a view
starting at row 0 (see staging.py). The engine releases a group's staged rows once its
readers finished, before the next group resolves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from services.common.backing import HostBackingProvider
from services.common.errors import InvalidArgument, NotFound, ResourceExhausted

from .config import HierarchyConfig, SourceSpec
from .group import SharedLayout, SourceGroup
from .pages import admit, can_admit, check_release, release, undo_admit
from .staging import StagingArena


class Hierarchy:
    """Source groups by name; host source ids are assigned in order (group, layer)."""

    def __init__(
        self,
        config: HierarchyConfig,
        specs: Sequence[SourceSpec],
        provider: HostBackingProvider | None = None,
        share_staging: bool = True,
    ) -> None:
        names = [s.name for s in specs]
        if not names or len(set(names)) != len(names):
            raise InvalidArgument(f"specs names={names} must be non-empty and distinct")
        self.config = config
        self.groups: dict[str, SourceGroup] = {}
        layouts = self._shared_layouts(config, specs) if share_staging else None
        next_id = 0
        for i, spec in enumerate(specs):
            ids = range(next_id, next_id + spec.payload_layers)
            self.groups[spec.name] = SourceGroup(
                spec, config, ids, provider, layout=None if layouts is None else layouts[i])
            next_id += spec.payload_layers
        self.shared_staging = layouts is not None

    @staticmethod
    def _shared_layouts(config: HierarchyConfig,
                        specs: Sequence[SourceSpec]) -> list[SharedLayout] | None:
        """One tensor per payload layer for all groups, staging first (page-aligned)."""
        shapes = {(s.row_bytes, s.payload_layers) for s in specs}
        if len(specs) < 2 or len(shapes) != 1 or config.staging_rows == 0:
            return None
        (row_bytes, layers), = shapes
        p, pages = config.page_rows, config.num_pages
        staged_pages = -(-config.staging_rows // p)
        rows = (staged_pages + len(specs) * pages) * p
        shared = [torch.zeros(rows, row_bytes, dtype=torch.uint8, device=config.torch_device)
                  for _ in range(layers)]
        arena = StagingArena(0, config.staging_rows)
        return [SharedLayout([t[: (staged_pages + (i + 1) * pages) * p] for t in shared],
                             staged_pages + i * pages, arena)
                for i in range(len(specs))]

    def group(self, name: str) -> SourceGroup:
        found = self.groups.get(name)
        if found is None:
            raise NotFound(f"source group={name!r} not found (groups: {list(self.groups)})")
        return found

    def can_admit(self, imported_rows: int) -> bool:
        return all(can_admit(g, imported_rows) for g in self.groups.values())

    def admit(
        self,
        request_id: str,
        max_rows: int,
        history: Mapping[str, Sequence[torch.Tensor]] | None = None,
        imported_rows: int = 0,
        max_optional: int | None = None,
    ) -> None:
        """Admit to every group (history keyed by group name), or to none."""
        if history is not None and set(history) != set(self.groups):
            raise InvalidArgument(
                f"history groups={sorted(history)} must be exactly {sorted(self.groups)}"
            )
        if any(request_id in g.requests for g in self.groups.values()):
            raise InvalidArgument(f"request_id={request_id!r} is already admitted")
        if history is None and not self.can_admit(imported_rows):
            raise ResourceExhausted(f"request_id={request_id!r} does not fit every group")
        done: list[SourceGroup] = []
        try:
            for name, group in self.groups.items():
                admit(group, request_id, max_rows, None if history is None else history[name],
                      imported_rows, max_optional)
                done.append(group)
        except Exception:
            for group in done:  # roll back: the request is admitted nowhere
                undo_admit(group, request_id)
            raise

    def release(self, request_id: str) -> None:
        """Free the request in every group, or (an error naming why) in none: every group's
        precondition is checked first; a host close that fails in one group still frees
        the others, and the first such error is raised after."""
        groups = [g for g in self.groups.values() if request_id in g.requests]
        if not groups:
            raise NotFound(f"request_id={request_id!r} is not admitted")
        for group in groups:
            check_release(group, request_id)
        failed: Exception | None = None
        for group in groups:
            try:
                release(group, request_id)
            except Exception as exc:  # the group is freed; its host close failed
                failed = failed or exc
        if failed is not None:
            raise failed

    def readers_finished(self) -> None:
        """Every reader of every resolve so far has finished (all groups)."""
        for group in self.groups.values():
            group.readers_finished()
