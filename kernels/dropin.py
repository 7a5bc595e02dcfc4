"""Drop-in CUDA twins of ``services.decode.hierarchy.resolve``, ``apply_copies`` and
``release_staging``.

Same signatures, same ResolvePlan, same resulting group state bit for bit, built on the
raw launches of ``kernels.resolver``. They read one small totals vector back between the
two launches: the host must learn the staging need to raise ResourceExhausted with
nothing changed and to keep the staging arena, counters and plan shapes exact. On a CPU
group, or with host rows that are not page-locked, they run the torch reference.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from services.common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from services.decode.hierarchy import resolver as ref
from services.decode.hierarchy.counters import SelectionCounts
from services.decode.hierarchy.group import SourceGroup
from services.decode.hierarchy.promotion import live_blocks, promote_wave, released_waves
from services.decode.hierarchy.promotion import release_staging as ref_release_staging
from services.decode.hierarchy.request import rank_words

from ._loader import vec_width
from .promote import promote, promote_fits
from .resolver import (
    R_COPIES,
    R_DIRECT,
    R_HOST,
    R_HOT,
    R_OPT,
    R_STAGED,
    R_STATUS,
    R_TAIL,
    S_M,
    S_NV,
    S_U,
    ST_NOT_RESIDENT,
    ST_SELECTION,
    TOT_COLS,
    CopyList,
    Workspace,
    commit,
    default_commit_parts,
    default_copy_blocks,
    lookup,
    plan_copy,
    table_row,
)


def request_table(group: SourceGroup, states: Sequence) -> torch.Tensor:
    """int64 [batch, T_COLS] on the group's device: ``table_rows``, pinned and copied."""
    return torch.tensor(table_rows(states), dtype=torch.int64).pin_memory().to(
        group.device, non_blocking=True)


def table_rows(states: Sequence) -> list[list[int]]:
    """The requests' table rows (``request_table`` before the device)."""
    return [
        table_row(
            hot_rows=s.hot_rows.data_ptr(),
            hot_stamp=s.hot_stamp.data_ptr(),
            hot_locs=s.hot_locs.data_ptr(),
            tail_locs=s.tail_locs.data_ptr(),
            page_map=s.page_map.data_ptr(),
            page_ready=s.page_ready.data_ptr(),
            hot_index=s.hot_index.data_ptr(),
            hot_rank=s.hot_rank.data_ptr(),
            rank_cap=rank_words(s.max_rows),
            tail_lo=s.tail_lo,
            tail_hi=s.tail_hi,
            map_hi=s.map_hi,
        )
        for s in states
    ]


_workspaces: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # cache: group -> Workspace


def _workspace(group: SourceGroup, batch: int, entries: int) -> Workspace:
    ws = _workspaces.get(group)
    if ws is None or not ws.fits(batch, entries, group.hot_slots):
        ws = Workspace.new(batch, entries, group.hot_slots, group.device)
        _workspaces[group] = ws
    return ws


def _structural_checks(
    group: SourceGroup, request_ids: Sequence[str], selections: torch.Tensor, visible: torch.Tensor
) -> list:
    """The reference's checks that need no device data (same exceptions, same messages)."""
    if group.pending_layers:
        raise FailedPrecondition(
            f"plan of epoch={group.pending_epoch} not applied to payload layers "
            f"{sorted(group.pending_layers)}; apply_copies before the next resolve"
        )
    for t, dims in ((selections, 3), (visible, 2)):
        if (
            not isinstance(t, torch.Tensor)
            or t.dtype != torch.int64
            or t.dim() != dims
            or t.device != group.device
        ):
            return []  # the reference raises the exact message
    if (
        tuple(visible.shape) != tuple(selections.shape[:2])
        or len(request_ids) != selections.shape[0]
        or len(set(request_ids)) != len(request_ids)
    ):
        return []
    return [group.request(rid) for rid in request_ids]


COPY_LAYERS = 4  # payload layers one resolve may copy in its commit launch


def _host_rows(
    group: SourceGroup, request_ids: Sequence[str], layers: Sequence[int]
) -> list[list[torch.Tensor]] | None:
    """Host rows ``[layer][request]`` the GPU can read in place, or None when a request has
    no host history (nothing to copy from) or some of them are not page-locked."""
    states = [group.request(rid) for rid in request_ids]
    if any(len(s.backings) != group.spec.payload_layers for s in states):
        return None
    hosts = [[s.backings[layer].rows() for s in states] for layer in layers]
    return hosts if all(_pinned(h) for row in hosts for h in row) else None


def _on_device(group: SourceGroup, values: list) -> torch.Tensor:
    """int64 values (addresses) to the device through pinned memory, without a host wait."""
    return torch.tensor(values, dtype=torch.int64).pin_memory().to(group.device, non_blocking=True)


def _copy_pointers(
    group: SourceGroup, request_ids: Sequence[str], layers: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(host_ptrs [L, batch], payload_ptrs [L]) on the device for the commit's miss copies,
    or None where ``_host_rows`` is None."""
    hosts = _host_rows(group, request_ids, layers)
    if hosts is None:
        return None
    return (_on_device(group, [[h.data_ptr() for h in row] for row in hosts]),
            _on_device(group, [group.payloads[layer].data_ptr() for layer in layers]))


def resolve(
    group: SourceGroup,
    request_ids: Sequence[str],
    selections: torch.Tensor,
    visible: torch.Tensor,
    copy_layers: Sequence[int] = (),
) -> ref.ResolvePlan:
    """Drop-in for ``services.decode.hierarchy.resolve`` (same plan, same state after).

    copy_layers: payload layers (at most 4) whose miss copies the commit launch does itself
    (the sync-free path's copies: no separate launch, no pointer upload per layer) -- as if
    ``apply_copies`` had run for each of them (same bytes, counters, pending layers: the
    plan's layers still to apply are ``group.pending_layers``). Left to ``apply_copies`` on
    the reference path, when some request has no host history, or when host rows are not
    page-locked."""
    if group.device.type != "cuda":
        return ref.resolve(group, request_ids, selections, visible)
    states = _structural_checks(group, request_ids, selections, visible)
    if (
        not states
        or selections.numel() == 0
        or not selections.is_contiguous()
        or not visible.is_contiguous()
    ):
        return ref.resolve(group, request_ids, selections, visible)  # raises, or trivial shapes
    batch, k_queries, k = selections.shape
    cfg, epoch = group.config, group.clock + 1
    copy_layers = tuple(copy_layers)
    for layer in copy_layers:
        group.check_layer(layer)
    if len(set(copy_layers)) != len(copy_layers) or len(copy_layers) > COPY_LAYERS:
        raise InvalidArgument(
            f"copy_layers={list(copy_layers)} must be distinct, at most {COPY_LAYERS}")
    ptrs = _copy_pointers(group, request_ids, copy_layers) if copy_layers else None
    if ptrs is None:
        copy_layers = ()
    copy_blocks = default_copy_blocks()  # a bad setting raises here, before any change
    parts = default_commit_parts()  # likewise
    vec_width(group.spec.row_bytes)  # the commit's copies need 4-byte rows: refuse now
    ws = _workspace(group, batch, k_queries * k)
    table = request_table(group, states)
    locations = torch.empty_like(selections)
    lookup(
        ws,
        table,
        selections,
        visible,
        locations,
        hot_slots=group.hot_slots,
        tail_rows=cfg.tail_rows,
        page_rows=cfg.page_rows,
        rows_bound=max(s.tail_lo for s in states),
        finished_epoch=group.finished_epoch,
    )
    totals = ws.totals[:TOT_COLS].cpu().tolist()  # the one host read: the staging need and counts
    if totals[R_STATUS] & ST_SELECTION:
        ref._check_inputs(group, request_ids, selections, visible)  # raises the exact error
        raise RuntimeError(
            f"resolver kernel flagged status={totals[R_STATUS]} the reference accepts"
        )
    if totals[R_STATUS] & ST_NOT_RESIDENT:
        direct = ws.summary[:batch, S_U].cpu()
        b = int(torch.nonzero(direct > 0)[0])
        raise RuntimeError(
            f"request_id={request_ids[b]!r}: rows needing the hot cache are not resident "
            f"(hot_slots=0)"
        )
    staged = totals[R_STAGED]
    if not group.staging.can_acquire(staged):
        raise ResourceExhausted(
            f"selections need staging rows={staged} > free staging rows="
            f"{len(group.staging.free_locs)} (staging_rows={cfg.staging_rows})"
        )
    stage_locs = _acquire_staging(group, request_ids, ws, batch, staged, epoch)
    n = batch * k_queries * k
    out = CopyList(
        *(torch.empty(n, dtype=torch.int64, device=group.device) for _ in range(3)),
        torch.empty(max(staged, 1), dtype=torch.int64, device=group.device),
    )
    commit(
        ws, table, selections, locations, stage_locs, out, epoch=epoch, hot_slots=group.hot_slots,
        host_ptrs=ptrs[0] if ptrs else None, payloads=ptrs[1] if ptrs else None,
        row_bytes=group.spec.row_bytes, copy_blocks=copy_blocks, parts=parts,
    )
    for s in states:
        group.note_read(s, epoch)
    group.clock = epoch
    copies = totals[R_COPIES]
    counts = SelectionCounts(
        tail=totals[R_TAIL],
        optional=totals[R_OPT],
        hot=totals[R_HOT],
        host=totals[R_HOST],
        host_rows=copies,
        staged_rows=staged,
        lookups=batch,
        direct_lookups=totals[R_DIRECT],
    )
    group.counters.add(counts)
    if copies:
        group.pending_epoch = epoch
        group.pending_layers = set(range(group.spec.payload_layers)) - set(copy_layers)
        nbytes = copies * group.spec.row_bytes * len(copy_layers)  # as apply_copies counts
        counts.host_bytes += nbytes
        group.counters.host_bytes += nbytes
    return ref.ResolvePlan(
        epoch=epoch,
        request_ids=tuple(request_ids),
        locations=locations,
        direct=ws.summary[:batch, S_U] == 0,
        copy_batch=out.batch[:copies],
        copy_rows=out.rows[:copies],
        copy_dst=out.dst[:copies],
        counts=counts,
    )


def _acquire_staging(
    group: SourceGroup,
    request_ids: Sequence[str],
    ws: Workspace,
    batch: int,
    staged: int,
    epoch: int,
) -> torch.Tensor:
    """Acquire the arena rows on the host exactly as the reference does (request order,
    ascending rows), and hand the kernel those rows in that order."""
    if staged == 0:
        return torch.empty(1, dtype=torch.int64, device=group.device)
    summary, misses = ws.summary[:batch].cpu().tolist(), ws.misses[:batch].cpu()
    locs: list[torch.Tensor] = []
    for b, rid in enumerate(request_ids):
        m, nv = summary[b][S_M], summary[b][S_NV]
        if m > nv:
            locs.append(group.staging.acquire(rid, misses[b, nv:m], epoch))
    return torch.cat(locs).to(group.device)


def _pinned(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" or t.is_pinned()


def apply_copies(group: SourceGroup, plan: ref.ResolvePlan, layer: int) -> int:
    """Drop-in for ``services.decode.hierarchy.apply_copies``: one launch reading the host
    rows of ``layer`` in place (the copy list is sorted by (request, row) = host address).
    Unlike the reference it does not re-check I1 (backed rows) on the host."""
    group.check_layer(layer)
    if plan.copy_rows.numel() == 0 or group.device.type != "cuda":
        return ref.apply_copies(group, plan, layer)
    hosts = _host_rows(group, plan.request_ids, [layer])
    if hosts is None:
        return ref.apply_copies(group, plan, layer)  # pageable host rows: no zero-copy path
    if plan.epoch != group.pending_epoch or layer not in group.pending_layers:
        raise FailedPrecondition(
            f"plan epoch={plan.epoch} layer={layer} is not pending (pending epoch="
            f"{group.pending_epoch}, layers={sorted(group.pending_layers)})"
        )
    payload, row_bytes = group.payloads[layer], group.spec.row_bytes
    host_ptrs = _on_device(group, [h.data_ptr() for h in hosts[0]])
    n = plan.copy_rows.numel()
    plan_copy(payload, plan.copy_batch, plan.copy_rows, plan.copy_dst, host_ptrs, n, row_bytes)
    group.pending_layers.discard(layer)
    nbytes = n * row_bytes
    plan.counts.host_bytes += nbytes
    group.counters.host_bytes += nbytes
    return nbytes


def release_staging(group: SourceGroup) -> int:
    """Drop-in for ``services.decode.hierarchy.release_staging`` (same state after)."""
    return int(release_staging_async(group))


def release_staging_async(group: SourceGroup) -> torch.Tensor:
    """``release_staging`` with one launch per promotion wave (``kernels.promote.promote``)
    and no host read: returns the rows promoted as an int64 device scalar. A wave whose
    row bitmap would not fit in shared memory (source rows beyond ~1.5M at B = 4096) is
    promoted by the torch path instead (same result)."""
    if group.device.type != "cuda":
        return torch.tensor(ref_release_staging(group))
    vec_width(group.spec.row_bytes)  # before released_waves() frees the staged rows
    total = torch.zeros((), dtype=torch.int64, device=group.device)
    payload_ptrs = None
    for wave in released_waves(group):
        live = live_blocks(group, wave)
        if not live:
            continue
        blocks, states = [b for b, _ in live], [s for _, s in live]
        rows = torch.cat([b.rows for b in blocks])
        bound = int(rows.max()) + 1
        if not promote_fits(group.hot_slots, bound, group.spec.row_bytes, group.device.index):
            total += promote_wave(group, wave)  # row bitmap beyond shared memory: torch
            continue
        if payload_ptrs is None:
            payload_ptrs = torch.tensor([p.data_ptr() for p in group.payloads], dtype=torch.int64)
        sizes = torch.tensor([0] + [b.rows.numel() for b in blocks], dtype=torch.int64)
        staged = torch.cat([rows, *(b.locs for b in blocks), sizes.cumsum(0),
                            torch.tensor([b.epoch for b in blocks], dtype=torch.int64),
                            payload_ptrs])
        staged = staged.pin_memory().to(group.device, non_blocking=True)
        n, nb = rows.numel(), len(blocks)
        promoted = torch.empty(nb, dtype=torch.int64, device=group.device)
        promote(
            request_table(group, states),
            staged[:n],
            staged[n: 2 * n],
            staged[2 * n: 2 * n + nb + 1],
            staged[2 * n + nb + 1: 2 * n + 2 * nb + 1],
            torch.empty(n, dtype=torch.int32, device=group.device),
            promoted,
            staged[2 * n + 2 * nb + 1:],
            hot_slots=group.hot_slots,
            rows_bound=bound,
            finished_epoch=group.finished_epoch,
            row_bytes=group.spec.row_bytes,
        )
        total += promoted.sum()
    return total
