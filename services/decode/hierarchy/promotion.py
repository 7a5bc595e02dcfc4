"""Staging promotion (paper §3.4): after a group's readers finished, its staged rows move
into LRU hot slots, then the arena rows are free again.

Definition (``_promote_one``, kernels and the reference share it): requests in acquisition
order, each request's staged rows in acquisition order, each row into the slot first in
(stamp, slot index) order among slots whose stamp is older than the row's epoch, that are
not protected and do not already hold the row.

``release_staging`` reaches the same state with a few device reads per group instead of
several per staged row: one acquisition block (one resolve's staged rows of one request)
at a time per request, the blocks of different requests together (their hot caches are
disjoint), each block by masked scatters (see ``promote_wave``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from services.common.errors import FailedPrecondition

from .request import lru_order, set_hot_rows, set_hot_rows_where
from .staging import StagedBlock, StagedRow

if TYPE_CHECKING:
    from .group import SourceGroup
    from .request import RequestState

NEVER = torch.iinfo(torch.int64).max  # sort key of a slot that may not take a row


def release_staging(group: SourceGroup) -> int:
    """Promote staged rows into hot slots, then free the arena. Returns rows promoted.

    Needs every reader of the staged epochs finished and every plan applied to all payload
    layers (FailedPrecondition otherwise; nothing changed).
    """
    return sum(promote_wave(group, wave) for wave in released_waves(group))


def released_waves(group: SourceGroup) -> list[list[StagedBlock]]:
    """Free ``group``'s staged rows; their blocks in promotion waves: a request's blocks in
    acquisition order, at most one per wave (the blocks of one wave have disjoint hot
    caches). FailedPrecondition, nothing changed, while plans or readers are pending."""
    if group.pending_layers:
        raise FailedPrecondition(
            f"plan of epoch={group.pending_epoch} not applied to payload layers "
            f"{sorted(group.pending_layers)}; apply_copies before release_staging"
        )
    pending = group.staging.release(group.finished_epoch)
    waves = []
    while pending:
        wave: list[StagedBlock] = []
        rest: list[StagedBlock] = []
        seen: set[str] = set()
        for block in pending:
            (rest if block.request_id in seen else wave).append(block)
            seen.add(block.request_id)
        waves.append(wave)
        pending = rest
    return waves


def live_blocks(group: SourceGroup,
                wave: list[StagedBlock]) -> list[tuple[StagedBlock, RequestState]]:
    """The blocks of ``wave`` whose request is still admitted and has hot slots."""
    live = [(b, group.requests.get(b.request_id)) for b in wave]
    return [(b, s) for b, s in live if s is not None and s.hot_rows.numel()]


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def promote_wave(group: SourceGroup, wave: list[StagedBlock]) -> int:
    """Blocks of distinct requests. Equal to one-by-one promotion when no block repeats a
    row or stages a row a slot already holds (a resolve stages distinct misses): a promoted
    slot takes the block's epoch as its stamp and so leaves the eligible set (stamp <
    epoch), so the i-th row takes the i-th eligible slot in LRU order until they run out.
    Two device reads in all (the premise check, the count); otherwise block by block."""
    live = live_blocks(group, wave)
    if not live:
        return 0
    dev = live[0][1].hot_rows.device
    rows_all = _to_device(torch.cat([b.rows for b, _ in live]), dev)
    locs_all = _to_device(torch.cat([b.locs for b, _ in live]), dev)
    parts, at = [], 0
    for b, s in live:
        n = b.rows.numel()
        parts.append((b, s, rows_all[at: at + n], locs_all[at: at + n]))
        at += n
    repeats = any(b.rows.unique().numel() != b.rows.numel() for b, _ in live)
    held = torch.stack([torch.isin(rows, s.hot_rows).any() for _, s, rows, _ in parts])
    if repeats or bool(held.any()):
        return sum(_promote_block(group, s, b) for b, s in live)
    counts = [_promote_masked(group, s, b.epoch, rows, locs) for b, s, rows, locs in parts]
    return int(torch.stack(counts).sum())


def _eligible(group: SourceGroup, state: RequestState, epoch: int) -> torch.Tensor:
    """The slots a row staged at ``epoch`` may take: used before that epoch and not
    protected (stamp at or below finished_epoch)."""
    return (state.hot_stamp < epoch) & (state.hot_stamp <= group.finished_epoch)


def _promote_masked(group: SourceGroup, state: RequestState, epoch: int, rows: torch.Tensor,
                    locs: torch.Tensor) -> torch.Tensor:
    """Rows ``i < eligible count`` into the i-th eligible slot in LRU order, with no device
    read: slots past the count get their own values written back. Returns the count
    promoted (a device scalar)."""
    eligible = _eligible(group, state, epoch)
    key = torch.where(eligible, state.hot_stamp, torch.full_like(state.hot_stamp, NEVER))
    order = torch.sort(key, stable=True).indices  # (stamp, slot) among eligible, then the rest
    r = min(rows.numel(), order.numel())
    take = order[:r]
    valid = torch.arange(r, device=rows.device) < eligible.sum()
    set_hot_rows_where(state, take, rows[:r], valid)
    state.hot_stamp[take] = torch.where(valid, torch.full_like(rows[:r], epoch),
                                        state.hot_stamp[take])
    dst = state.hot_locs[take]
    for payload in group.payloads:
        payload[dst] = torch.where(valid[:, None], payload[locs[:r]], payload[dst])
    return valid.sum()


def _promote_block(group: SourceGroup, state: RequestState, block: StagedBlock) -> int:
    """One block, the rows one by one (the definition)."""
    return sum(_promote_one(group, state, StagedRow(block.request_id, r, loc, block.epoch))
               for r, loc in zip(block.rows.tolist(), block.locs.tolist(), strict=True))


def _promote_one(group: SourceGroup, state: RequestState, entry: StagedRow) -> int:
    """The definition: ``entry``'s row into the LRU-first eligible slot not holding it."""
    eligible = _eligible(group, state, entry.epoch)
    if bool((state.hot_rows == entry.row).any()) or not bool(eligible.any()):
        return 0
    slot = lru_order(state.hot_stamp, eligible)[0]
    dst = state.hot_locs[slot]
    for payload in group.payloads:
        payload[dst] = payload[entry.loc]
    set_hot_rows(state, slot[None], torch.tensor([entry.row], device=slot.device))
    state.hot_stamp[slot] = entry.epoch
    return 1
