"""All source groups of one decode worker, with admission and release across them.

An engine holds one ``Hierarchy``; each KV source group is resolved separately
(``resolve(h.group(name), ...)``), but a request is admitted to and released from every
group at once: either it is admitted everywhere or nowhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from services.common.backing import HostBackingProvider
from services.common.errors import InvalidArgument, NotFound, ResourceExhausted

from .config import HierarchyConfig, SourceSpec
from .group import SourceGroup
from .pages import admit, can_admit, release


class Hierarchy:
    """Source groups by name; host source ids are assigned in order (group, layer)."""

    def __init__(
        self,
        config: HierarchyConfig,
        specs: Sequence[SourceSpec],
        provider: HostBackingProvider | None = None,
    ) -> None:
        names = [s.name for s in specs]
        if not names or len(set(names)) != len(names):
            raise InvalidArgument(f"specs names={names} must be non-empty and distinct")
        self.config = config
        self.groups: dict[str, SourceGroup] = {}
        next_id = 0
        for spec in specs:
            ids = range(next_id, next_id + spec.payload_layers)
            self.groups[spec.name] = SourceGroup(spec, config, ids, provider)
            next_id += spec.payload_layers

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
                release(group, request_id)
            raise

    def release(self, request_id: str) -> None:
        groups = [g for g in self.groups.values() if request_id in g.requests]
        if not groups:
            raise NotFound(f"request_id={request_id!r} is not admitted")
        for group in groups:
            release(group, request_id)

    def readers_finished(self) -> None:
        """Every reader of every resolve so far has finished (all groups)."""
        for group in self.groups.values():
            group.readers_finished()
