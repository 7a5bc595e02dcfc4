"""The exact resolver (paper §3.2, DESIGN.md §3): selections -> pool locations.

Input, for one source group and a batch of admitted requests::

    selections  int64 [batch, K, k]  ordered top-k source rows of each query, -1 = padding
    visible     int64 [batch, K]     exclusive bound of each query's visible rows (eq. 5):
                                     query j of request r sees rows < n_r + j + 1

Output: a ``ResolvePlan`` whose ``locations`` (int64 [batch, K, k], -1 for padding)
index every payload tensor of the group, ``payload[locations]`` being the selected rows
once the plan's copies were applied to that payload layer (``apply_copies``).

Per request r (requests are independent; only the staging arena is shared):

1. direct: rows in the tail ``[tail_lo, tail_hi)`` -> ``tail_locs[row % T]``; rows of a
   ready optional page g -> ``page_map[g] * p + row % p``. If every entry resolved here
   the lookup is *direct* and steps 2-3 are skipped (no LRU state changes).
2. hot: ``D`` = sorted distinct remaining rows (the union over the K queries, eq. 6).
   Rows found in ``hot_rows`` (scan bounded by B) are hits: stamp = epoch (so protected
   until the readers of this epoch finish).
3. host: the remaining rows (ascending) take victim slots — the first in LRU order of
   the unprotected (``hot_stamp <= finished_epoch``) slots not hit this round, by
   (stamp, slot) ascending — in slot order (every victim gets this epoch's stamp, so no
   pairing is more LRU than another; the kernel lists slot order from a bitmap instead of
   ranking the victims by key, kernels/resolver_lookup.cu); rows beyond the victims go to
   the staging arena (ascending rows, FIFO arena rows).
   Each distinct row is copied from host once; the copy list is sorted by (batch, row),
   i.e. by host address within a request.

Everything is validated before any state changes; bad input raises InvalidArgument
(naming argument, value and limit), unknown requests NotFound, an arena too small
ResourceExhausted, a plan not yet applied to every payload layer FailedPrecondition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted

from .counters import SelectionCounts
from .group import SourceGroup
from .request import RequestState, lru_order, set_hot_rows


@dataclass(frozen=True, slots=True)
class ResolvePlan:
    """Result of one resolve: locations plus the host copies every payload layer needs.

    locations    int64 [batch, K, k]  pool rows, -1 where the selection was -1
    direct       bool  [batch]        lookup wholly resolved in step 1
    copy_batch   int64 [C]            batch index of each copy      } sorted by
    copy_rows    int64 [C]            source (host) row to copy     } (batch, row)
    copy_dst     int64 [C]            destination pool row (hot slot or staging)
    """

    epoch: int
    request_ids: tuple[str, ...]
    locations: torch.Tensor
    direct: torch.Tensor
    copy_batch: torch.Tensor
    copy_rows: torch.Tensor
    copy_dst: torch.Tensor
    counts: SelectionCounts


@dataclass(slots=True)
class _Lookup:
    """Dry-run outcome for one request (nothing mutated yet)."""

    flat: torch.Tensor  # int64 [K*k] the request's selections, flattened
    loc: torch.Tensor  # int64 [K*k], -1 where not resolved yet
    rest: torch.Tensor  # bool [K*k], entries needing steps 2-3
    need: torch.Tensor  # int64 [u] sorted distinct rows of the rest
    need_hit_slot: torch.Tensor  # int64 [u] hot slot of a hit, -1 for a miss
    victims: torch.Tensor  # int64 [h] slots taken by the first h misses, ascending
    misses: torch.Tensor  # int64 [m] missed rows, ascending
    counts: SelectionCounts


def resolve(
    group: SourceGroup,
    request_ids: Sequence[str],
    selections: torch.Tensor,
    visible: torch.Tensor,
) -> ResolvePlan:
    """Resolve ``selections [batch, K, k]`` of ``request_ids`` into a ``ResolvePlan``."""
    states = _check_inputs(group, request_ids, selections, visible)
    epoch = group.clock + 1
    lookups = [_lookup(group, s, sel) for s, sel in zip(states, selections, strict=True)]
    staged = sum(max(0, lu.misses.numel() - lu.victims.numel()) for lu in lookups)
    if not group.staging.can_acquire(staged):
        raise ResourceExhausted(
            f"selections need staging rows={staged} > free staging rows="
            f"{len(group.staging.free_locs)} (staging_rows={group.config.staging_rows})"
        )
    counts = SelectionCounts()
    copies: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    for b, (state, lu) in enumerate(zip(states, lookups, strict=True)):
        rows, dst = _commit_lookup(group, state, lu, epoch)
        if rows.numel():
            copies.append((b, rows, dst))
        group.note_read(state, epoch)
        counts.add(lu.counts)
    group.clock = epoch
    group.counters.add(counts)
    plan = _make_plan(group, epoch, request_ids, selections.shape, lookups, copies, counts)
    if plan.copy_rows.numel():
        group.pending_epoch = epoch
        group.pending_layers = set(range(group.spec.payload_layers))
    return plan


def apply_copies(group: SourceGroup, plan: ResolvePlan, layer: int) -> int:
    """Copy the plan's host rows of payload ``layer`` into the pool. Returns bytes copied.

    Call once per payload layer of the group (followers may overlap with compute), before
    that layer's attention reads ``plan.locations``.
    """
    group.check_layer(layer)
    if plan.copy_rows.numel() == 0:
        return 0
    if plan.epoch != group.pending_epoch or layer not in group.pending_layers:
        raise FailedPrecondition(
            f"plan epoch={plan.epoch} layer={layer} is not pending (pending epoch="
            f"{group.pending_epoch}, layers={sorted(group.pending_layers)})"
        )
    payload = group.payloads[layer]
    batch = plan.copy_batch.cpu()
    for b in torch.unique(batch).tolist():
        mask = batch == b
        rows = plan.copy_rows.cpu()[mask]
        backing = group.request(plan.request_ids[b]).backings[layer]
        if not bool(backing.backed_mask()[rows].all()):
            raise RuntimeError(f"I1 violated: host rows {rows.tolist()} are not all backed")
        payload[plan.copy_dst[mask.to(plan.copy_dst.device)]] = backing.rows()[rows].to(
            payload.device, non_blocking=True
        )
    group.pending_layers.discard(layer)
    nbytes = plan.copy_rows.numel() * group.spec.row_bytes
    plan.counts.host_bytes += nbytes
    group.counters.host_bytes += nbytes
    return nbytes


def _check_inputs(
    group: SourceGroup, request_ids: Sequence[str], selections: torch.Tensor, visible: torch.Tensor
) -> list[RequestState]:
    if group.pending_layers:
        raise FailedPrecondition(
            f"plan of epoch={group.pending_epoch} not applied to payload layers "
            f"{sorted(group.pending_layers)}; apply_copies before the next resolve"
        )
    for name, t, dims in (("selections", selections, 3), ("visible", visible, 2)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.dim() != dims:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            dtype = getattr(t, "dtype", None)
            raise InvalidArgument(
                f"{name} has dtype={dtype} shape={shape}; expected int64 with {dims} dims"
            )
        if t.device != group.device:
            raise InvalidArgument(f"{name} is on device={t.device}; expected {group.device}")
    batch, k_queries = selections.shape[:2]
    if tuple(visible.shape) != (batch, k_queries):
        raise InvalidArgument(
            f"visible has shape={tuple(visible.shape)}; expected (batch, K)={(batch, k_queries)}"
        )
    if len(request_ids) != batch or len(set(request_ids)) != batch:
        raise InvalidArgument(
            f"request_ids={list(request_ids)!r} must be {batch} distinct ids (selections batch)"
        )
    states = [group.request(rid) for rid in request_ids]
    if selections.numel() and int(selections.min()) < -1:
        b, j, i = (int(x) for x in torch.nonzero(selections < -1)[0])
        raise InvalidArgument(
            f"selections[{b}, {j}, {i}]={int(selections[b, j, i])} must be >= -1 (-1 = padding)"
        )
    limits = torch.tensor([s.tail_hi for s in states], dtype=torch.int64, device=group.device)
    bad = (visible < 0) | (visible > limits[:, None])
    if bool(bad.any()):
        b, j = (int(x) for x in torch.nonzero(bad)[0])
        raise InvalidArgument(
            f"visible[{b}, {j}]={int(visible[b, j])} outside [0, {int(limits[b])}] "
            f"(rows opened for request_id={request_ids[b]!r})"
        )
    bad = selections >= visible[:, :, None]
    if bool(bad.any()):
        b, j, i = (int(x) for x in torch.nonzero(bad)[0])
        raise InvalidArgument(
            f"selections[{b}, {j}, {i}]={int(selections[b, j, i])} must be < "
            f"visible[{b}, {j}]={int(visible[b, j])} (query {j} of request_id="
            f"{request_ids[b]!r} sees rows below it)"
        )
    return states


def _lookup(group: SourceGroup, state: RequestState, sel: torch.Tensor) -> _Lookup:
    p, flat = group.config.page_rows, sel.reshape(-1)
    loc = torch.full_like(flat, -1)
    valid = flat >= 0
    # step 1: tail, then ready optional pages
    in_tail = valid & (flat >= state.tail_lo) & (flat < state.tail_hi)
    loc[in_tail] = state.tail_locs[flat[in_tail] % state.tail_locs.numel()]
    page = torch.where(valid, flat // p, 0)
    in_opt = valid & ~in_tail & state.page_ready[page]
    loc[in_opt] = state.page_map[page[in_opt]] * p + flat[in_opt] % p
    rest = valid & ~in_tail & ~in_opt
    counts = SelectionCounts(
        tail=int(in_tail.sum()), optional=int(in_opt.sum()), lookups=1
    )
    need = torch.unique(flat[rest])  # sorted: the request's union of remaining rows
    empty = need[:0]
    if need.numel() == 0:
        counts.direct_lookups = 1
        return _Lookup(flat, loc, rest, need, empty, empty, empty, counts)
    if state.hot_rows.numel() == 0:
        raise RuntimeError(f"request_id={state.request_id!r}: rows {need.tolist()} not resident")
    # step 2: hot-cache scan, bounded by B
    match = need[:, None] == state.hot_rows[None, :]  # [u, B]
    hit = match.any(dim=1)
    need_hit_slot = torch.where(hit, match.to(torch.int8).argmax(dim=1), -1)
    # step 3: misses take the unprotected LRU victims (in slot order), the rest go to staging
    candidates = (state.hot_stamp <= group.finished_epoch) & ~match.any(dim=0)
    misses = need[~hit]
    victims = lru_order(state.hot_stamp, candidates)[: misses.numel()].sort().values
    entry_hit = hit[torch.searchsorted(need, flat[rest])]
    counts.hot = int(entry_hit.sum())
    counts.host = int((~entry_hit).sum())
    counts.host_rows = misses.numel()
    counts.staged_rows = misses.numel() - victims.numel()
    return _Lookup(flat, loc, rest, need, need_hit_slot, victims, misses, counts)


def _commit_lookup(
    group: SourceGroup, state: RequestState, lu: _Lookup, epoch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply one request's lookup to its state; returns (copy rows, copy destinations)."""
    if lu.need.numel() == 0:
        return lu.need, lu.need
    hit_slots = lu.need_hit_slot[lu.need_hit_slot >= 0]
    n_hot = lu.victims.numel()
    set_hot_rows(state, lu.victims, lu.misses[:n_hot])
    touched = torch.cat([hit_slots, lu.victims])
    state.hot_stamp[touched] = epoch
    staged_rows = lu.misses[n_hot:]
    staged_locs = group.staging.acquire(state.request_id, staged_rows, epoch)
    dst = torch.cat([state.hot_locs[lu.victims], staged_locs.to(group.device)])
    # locations of every distinct row, aligned with need, then scattered to the entries
    need_loc = torch.empty_like(lu.need)
    hit = lu.need_hit_slot >= 0
    need_loc[hit] = state.hot_locs[lu.need_hit_slot[hit]]
    need_loc[~hit] = dst
    lu.loc[lu.rest] = need_loc[torch.searchsorted(lu.need, lu.flat[lu.rest])]
    return lu.misses, dst


def _make_plan(
    group: SourceGroup,
    epoch: int,
    request_ids: Sequence[str],
    shape: torch.Size,
    lookups: list[_Lookup],
    copies: list[tuple[int, torch.Tensor, torch.Tensor]],
    counts: SelectionCounts,
) -> ResolvePlan:
    dev = group.device
    locations = (
        torch.stack([lu.loc for lu in lookups]).reshape(shape)
        if lookups
        else torch.empty(shape, dtype=torch.int64, device=dev)
    )
    direct = torch.tensor([lu.need.numel() == 0 for lu in lookups], dtype=torch.bool, device=dev)
    empty = torch.empty(0, dtype=torch.int64, device=dev)
    return ResolvePlan(
        epoch=epoch,
        request_ids=tuple(request_ids),
        locations=locations,
        direct=direct,
        copy_batch=torch.cat([torch.full_like(r, b) for b, r, _ in copies]) if copies else empty,
        copy_rows=torch.cat([r for _, r, _ in copies]) if copies else empty,
        copy_dst=torch.cat([d for _, _, d in copies]) if copies else empty,
        counts=counts,
    )
