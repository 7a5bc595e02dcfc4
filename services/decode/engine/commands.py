"""Executing the residency controller's commands on a worker's hierarchy.

Backup, Retire and Populate apply to every source group of the request (a ledger page is
one page in each group). Each returns the pages it moved; the caller acknowledges.
"""

from __future__ import annotations

from services.decode.hierarchy import Hierarchy, backup, populate, retire
from services.residency.core import Command, CommandKind


def execute_command(hierarchy: Hierarchy, cmd: Command) -> int:
    """Run ``cmd``; returns pages backed up / retired / populated (same in every group)."""
    groups = list(hierarchy.groups.values())
    if cmd.kind is CommandKind.BACKUP:
        p = hierarchy.config.page_rows
        return max(backup(g, cmd.request_id) for g in groups) // p
    if cmd.kind is CommandKind.RETIRE:
        moved = set()
        for g in groups:
            optional = g.request(cmd.request_id).optional_logical_pages()
            moved.add(retire(g, cmd.request_id, optional[len(optional) - cmd.pages:]
                             if cmd.pages else []))
        return _same(moved, cmd)
    if cmd.kind is CommandKind.POPULATE:
        return _same({populate(g, cmd.request_id, cmd.pages) for g in groups}, cmd)
    raise ValueError(f"unknown command kind {cmd.kind!r}")


def _same(counts: set[int], cmd: Command) -> int:
    if len(counts) != 1 or next(iter(counts)) != cmd.pages:
        raise RuntimeError(f"{cmd.kind.value} of {cmd.pages} pages for {cmd.request_id!r} "
                           f"moved {sorted(counts)} pages: hierarchy and ledger disagree (I2)")
    return cmd.pages
