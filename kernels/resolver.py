"""Fused CUDA resolver over ``services.decode.hierarchy``'s layout (kernels: resolver_common.cuh,
resolver_lookup.cu, resolver_commit.cu).

``lookup`` / ``commit`` / ``plan_copy`` are the sync-free launches over raw tables (what
the benchmark calls): no host synchronization, status on the device. Their drop-in twins
of ``services.decode.hierarchy.resolve`` / ``apply_copies`` over a ``SourceGroup`` are in
``kernels.dropin``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from services.common.errors import InvalidArgument

from ._loader import (
    capability,
    check,
    check_limit,
    dynamic_shared_cap,
    kernel,
    launch,
    launch_dependent,
    ptr,
    sm_count,
    vec_width,
)
from .resolver_settings import (  # re-exported: the wrappers' settings live there
    MAX_COMMIT_PARTS,
    MAX_COPY_BLOCKS,
    TMA_ROWS,
    VICTIM_SELECT,
    commit_parts_rule,
    copy_tma,
    default_commit_parts,
    default_copy_blocks,
    default_copy_early,
    default_select,
    defines,
    hit_form,
    launched_copy_blocks,
    lookup_shape,
)

# the request table's columns in resolver_common.cuh's T_* order (one int64 each: the
# per-request tensors' addresses, the hot_rank bitmap's words, the tail bounds, the bound of
# the mapped pages: RequestState.map_hi)
TABLE_COLUMNS = ("hot_rows", "hot_stamp", "hot_locs", "tail_locs", "page_map", "page_ready",
                 "hot_index", "hot_rank", "rank_cap", "tail_lo", "tail_hi", "map_hi")
T_COLS, S_COLS, TOT_COLS = len(TABLE_COLUMNS), 11, 14  # table / summary / totals columns
S_U, S_M, S_NV = 1, 2, 3
R_STATUS, R_COPIES, R_STAGED, R_TAIL, R_OPT, R_HOT, R_HOST, R_DIRECT = range(8)
R_PEND = 9  # 2 x (copies, status) pending on the sync-free path, by parity
R_PRELOADS = 13  # copy blocks that preloaded, summed over every call of the workspace
ST_SELECTION, ST_NOT_RESIDENT, ST_STAGING = 1 | 2 | 4 | 16, 8, 32
LOOKUP_THREADS, COMMIT_THREADS = 1024, 512
# resolver_sort.cuh at 1024 threads: B <= 4096 sorts in registers; larger B in shared memory
SORT_N = 4096
MAX_BATCH, MAX_ENTRIES, MAX_SLOTS = (
    1024,
    65535,
    1 << 20,
)  # resolver kernels: MAXB, u16 ranks, 20-bit slot keys


def sort_size(hot_slots: int) -> int:
    """Keys the block sorts for B hot slots (resolver_sort.cuh): B rounded up to a power of
    two, at least SORT_N (the register sort)."""
    return max(SORT_N, 1 << max(0, (max(hot_slots, 1) - 1).bit_length()))


def bitmap_words(rows_bound: int) -> int:
    """32-bit words of a shared bitmap over source rows ``[0, rows_bound)``."""
    return max(1, -(-rows_bound // 32))


@dataclass(slots=True)
class Workspace:
    """Scratch of the two launches, reused call after call on one stream.

    totals[R_TICKET] and the R_PEND slots must start at 0 (``new`` zeroes them); the last
    lookup block resets the ticket, each sync-free commit the next call's slots.
    """

    miss_dst: torch.Tensor  # int64 [batch, K*k]  each miss's destination pool row (commit)
    misses: torch.Tensor  # int64 [batch, K*k]  missed rows, ascending
    victims: torch.Tensor  # int32 [batch, B]
    hit_mask: torch.Tensor  # int32 [batch, B]: hot-scan hits, bit s % 32 of word s // 32
    summary: torch.Tensor  # int64 [batch, S_COLS]
    totals: torch.Tensor  # int64 [TOT_COLS + 2 * (batch + 1)]
    # set by lookup: the commit sums the summaries into totals (lookup(host_totals=False))
    commit_sums: bool = False
    # set by lookup(host_totals=False), flipped call by call: the R_PEND slots of this call
    # (resolver_common.cuh); the commit clears the other parity's for the next call
    parity: int = 0
    # set by lookup(host_totals=False): this call's tag in [1, 2^30], the lookup's S_EARLY
    # miss counts carry it (a commit's preload waits for every request's of its call)
    call: int = 0

    @staticmethod
    def new(batch: int, entries: int, slots: int, device: torch.device) -> Workspace:
        i64, i32 = dict(dtype=torch.int64, device=device), dict(dtype=torch.int32, device=device)
        return Workspace(
            torch.empty(batch, entries, **i64),
            torch.empty(batch, entries, **i64),
            torch.empty(batch, max(slots, 1), **i32),
            torch.empty(batch, max(slots, 1), **i32),
            torch.zeros(batch, S_COLS, **i64),  # S_EARLY: no call's tag
            torch.zeros(TOT_COLS + 2 * (batch + 1), **i64),
        )

    def pointers(self) -> tuple[np.uint64, ...]:
        """Device addresses in the order both launches take them (miss_dst .. totals)."""
        return tuple(ptr(t) for t in (self.miss_dst, self.misses, self.victims,
                                      self.hit_mask, self.summary, self.totals))

    def check(self, batch: int, entries: int, slots: int) -> None:
        """Refuse (InvalidArgument) a workspace the kernels would index past: they address
        miss_dst / misses as [batch, entries], victims / hit_mask as [batch, slots],
        summary as [batch, S_COLS] and totals up to TOT_COLS + 2 * (batch + 1)."""
        need = {
            "ws.miss_dst": (self.miss_dst, batch * entries),
            "ws.misses": (self.misses, batch * entries),
            "ws.victims": (self.victims, batch * max(slots, 1)),
            "ws.hit_mask": (self.hit_mask, batch * max(slots, 1)),
            "ws.summary": (self.summary, batch * S_COLS),
            "ws.totals": (self.totals, TOT_COLS + 2 * (batch + 1)),
        }
        for name, (t, n) in need.items():
            if t.numel() < n or not t.is_contiguous():
                raise InvalidArgument(
                    f"{name} holds {t.numel()} values; batch={batch}, K*k={entries}, "
                    f"hot_slots={slots} need {n} (make it with Workspace.new)")

    def fits(self, batch: int, entries: int, slots: int) -> bool:
        return (
            self.miss_dst.shape[0] >= batch
            and self.miss_dst.shape[1] == entries
            and self.victims.shape[1] >= max(slots, 1)
            and self.totals.numel() == TOT_COLS + 2 * (batch + 1)
        )


def lookup(
    ws: Workspace,
    table: torch.Tensor,
    selections: torch.Tensor,
    visible: torch.Tensor,
    locations: torch.Tensor,
    *,
    hot_slots: int,
    tail_rows: int,
    page_rows: int,
    rows_bound: int,
    finished_epoch: int,
    select: str | None = None,
    host_totals: bool = True,
    hits: str | None = None,
) -> None:
    """Launch 1: direct path, union, hot hits, LRU victims; writes ``locations`` (final for
    direct/hot entries, ``-2 - miss rank`` for misses) and ``ws``; mutates no state but
    the requests' hot_rank caches (derived from hot_rows, rebuilt where stale).

    host_totals: the last lookup block sums the batch into ``ws.totals`` (offsets, status,
    counts) for the host to read before ``commit``. False on the sync-free path: no ticket
    and no last block here; the ``commit`` launch sums the summaries itself (every block
    for its own offsets, the last block into ``ws.totals``), which shortens the chain of the
    call; the lookup blocks also add their pending copies and status to the slots of
    ``ws.parity`` (flipped here), so that a commit with nothing pending leaves the
    sums to one block.

    select: how the victims (the nv oldest candidates, listed in slot order) are chosen,
    "radix" (radix select of the nv-th oldest key, nv <= 1024; "radix_match" counts its
    bins with warp-aggregated atomics) or "sort" (bitonic sort of every slot key); all give
    the reference's victims (see ``default_select``). When every candidate is a victim
    neither runs.

    hits: how hot hits are found, "index" (a hot_index load per entry) or "rank" (the
    request's hot_rank cache in shared memory, resolver_rank.cuh); None = ``hit_form``.

    table: int64 [batch, T_COLS] per request (resolver_common.cuh T_* columns); rows_bound:
    every row needing steps 2-3 is below it (max tail_lo of the batch).
    """
    select = select or default_select()
    if select not in VICTIM_SELECT:
        raise InvalidArgument(f"select={select!r} must be one of {sorted(VICTIM_SELECT)}")
    check_limit("tail_rows", tail_rows, INT32_MAX, 1)
    check_limit("page_rows", page_rows, INT32_MAX, 1)
    check_limit("rows_bound", rows_bound, INT32_MAX * 32)
    batch, k_queries, k = _check_round(ws, table, selections, locations, hot_slots, visible)
    words, pow2 = bitmap_words(rows_bound), sort_size(hot_slots)
    dev = selections.device.index
    sms = sm_count(dev)
    func, flags, threads = lookup_variant(batch, sms)
    q = query_kernels(k_queries, k)
    ranked = kernel("resolver", func + "_rank" + q, dev, True, flags)
    cap = dynamic_shared_cap(ranked, dev)  # 227 KB opt-in minus 1.25 KB static (ptxas -v)
    fits = lookup_shared_bytes(words, pow2, True) <= cap
    rank = hit_form(hits, hot_slots, fits, batch, sms) == "rank"
    fn = ranked
    if not rank:
        fn = kernel("resolver", func + q, dev, True, flags)
        cap = dynamic_shared_cap(fn, dev)
    shared = lookup_shared_bytes(words, pow2, rank)
    call = 0 if host_totals else ws.call % (1 << 30) + 1  # the sync-free path's tag
    check_limit(f"shared bytes ({48 if rank else 24} * ceil(rows_bound / 128) + 8.125 * pow2(B)"
                f"{' + up to 8' if rank else ''})", shared, cap)
    args = (
        ptr(table),
        ptr(selections),
        ptr(visible),
        ptr(locations),
        *ws.pointers(),
        np.int32(batch),
        np.int32(k_queries),
        np.int32(k),
        np.int32(hot_slots),
        np.int32(pow2),
        np.int32(tail_rows),
        np.int32(page_rows),
        np.int32(words),
        np.int64(finished_epoch),
        np.int32(VICTIM_SELECT[select]),
        np.int32(bool(host_totals)),
        np.int32(ws.parity ^ (not host_totals)),
        np.int32(call),
    )
    launch(fn, (batch,), (threads,), args, shared)
    if not host_totals:
        ws.parity ^= 1
        ws.call = call
    ws.commit_sums = not host_totals


INT32_MAX = 2**31 - 1


def table_row(**columns: int) -> list[int]:
    """One request's row of the lookup's table, every column of ``TABLE_COLUMNS`` named
    (its order is the kernels'; a name missing or unknown is a programming error)."""
    if set(columns) != set(TABLE_COLUMNS):
        raise TypeError(f"table_row: missing {sorted(set(TABLE_COLUMNS) - set(columns))}, "
                        f"unknown {sorted(set(columns) - set(TABLE_COLUMNS))}")
    return [int(columns[c]) for c in TABLE_COLUMNS]


def lookup_variant(batch: int = 0, sms: int = 0) -> tuple[str, tuple[str, ...], int]:
    """The lookup kernel ``lookup_shape`` picks for ``batch`` requests on ``sms`` SMs: its
    name, the compile flags of its module (a 512-thread build is a module of its own: a
    phase trace reads that module's ``g_trace``) and its threads per block."""
    threads, per_sm = lookup_shape(batch, sms)
    flags = defines() + (() if threads == LOOKUP_THREADS else (f"-DNT={threads}",))
    return ("resolve_lookup_2" if per_sm == 2 else "resolve_lookup"), flags, threads


def query_kernels(k_queries: int, k: int) -> str:
    """The lookup kernels' suffix for K = ``k_queries`` queries of ``k`` entries: "_q", the
    kernels with the identical-queries path (resolver_lookup.cu same_queries), for K > 1 and
    k > 0; else "" (K = 1 calls keep kernels without its registers). The _q kernels' pass
    over the other queries' entries begins at entry k: with k = 0 and a later bound below
    the first's (queries not the same) their loop would never end, and without entries
    there is nothing to share."""
    return "_q" if k_queries > 1 and k > 0 else ""


def lookup_shared_bytes(words: int, pow2: int, rank: bool = False) -> int:
    """Dynamic shared memory of the lookup (resolver_lookup.cu): the miss bitmap (u32) and
    its prefix (u16) over ``words`` rounded up to 16-byte groups, the hit bitmap over the
    ``pow2`` sorted slots, then their LRU keys (u64); the rank form adds a held-row bitmap
    (at the next 16-byte boundary) and its prefix over the same words."""
    wp = -(-words // 4) * 4
    base = 6 * wp + pow2 // 8 + 8 * pow2
    return -(-base // 16) * 16 + 6 * wp if rank else base  # held_at in resolver_lookup.cu


def _check_round(ws: Workspace, table: torch.Tensor, selections: torch.Tensor,
                 locations: torch.Tensor, hot_slots: int,
                 visible: torch.Tensor | None = None) -> tuple[int, int, int]:
    """The round's tensors and workspace, as both launches index them: (batch, K, k).
    Shapes and sizes first, the device last (a CPU call names a bad shape)."""
    check("table", table, torch.int64, 2, "any")
    check("selections", selections, torch.int64, 3, "any")
    check("locations", locations, torch.int64, 3, "any")
    batch, k_queries, k = selections.shape
    if visible is not None:
        check("visible", visible, torch.int64, 2, "any")
    if (
        table.shape != (batch, T_COLS)
        or (visible is not None and visible.shape != (batch, k_queries))
        or locations.shape != selections.shape
    ):
        shown = "-" if visible is None else tuple(visible.shape)
        raise InvalidArgument(
            f"table {tuple(table.shape)}, visible {shown}, locations "
            f"{tuple(locations.shape)} must be [batch, {T_COLS}], [batch, K], like selections"
        )
    check_limit("batch", batch, MAX_BATCH)
    check_limit("K * k", k_queries * k, MAX_ENTRIES)
    check_limit("hot_slots", hot_slots, MAX_SLOTS)
    ws.check(batch, k_queries * k, hot_slots)
    for name, t in (("table", table), ("selections", selections), ("locations", locations),
                    ("visible", visible)):
        if t is not None:
            check(name, t, torch.int64, t.dim(), "cuda")
    return batch, k_queries, k


@dataclass(slots=True)
class CopyList:
    """Outputs of launch 2: the plan's copy list (first totals[R_COPIES] entries valid)."""

    batch: torch.Tensor
    rows: torch.Tensor
    dst: torch.Tensor
    staged_rows: torch.Tensor  # first totals[R_STAGED] entries: staged rows, in stage_locs order


def commit(
    ws: Workspace,
    table: torch.Tensor,
    selections: torch.Tensor,
    locations: torch.Tensor,
    stage_locs: torch.Tensor,
    out: CopyList,
    *,
    epoch: int,
    hot_slots: int,
    host_ptrs: torch.Tensor | None = None,
    payloads: torch.Tensor | None = None,
    row_bytes: int = 16,
    copy_blocks: int | None = None,
    dependent: bool = False,
    parts: int | None = None,
    early: bool | None = None,
    tma: bool | None = None,
) -> None:
    """Launch 2: apply the lookup (victims, stamps, staging), finish ``locations`` and the
    copy list; with ``host_ptrs`` (int64 [L, batch]) and ``payloads`` (int64 [L]) also copy
    the misses of those L layers from mapped host memory. Staged rows take
    ``stage_locs[0..]`` in (request, ascending row) order; if they do not fit, status gets
    ST_STAGING and nothing changes.

    copy_blocks: blocks sharing the miss copies; 0 = the kernel's rule (``launched_copy_blocks``
    launched; at work 48 while the batch misses at most 1024 rows per request and 16384 in
    all, copying them by 16-byte loads, 16 while it misses more but at most 1024 per
    request, else about one per 512 copy items of the mean request's misses, at least 16;
    resolver_copy.cuh copy_share); None =
    ``default_copy_blocks()``.
    parts: commit blocks per request, each stamping the hits of 1 / parts of its slots
    (part 0 also takes the misses); 0 = ``commit_parts_rule``; None =
    ``default_commit_parts()``.
    dependent: this launch directly follows ``lookup`` on the stream (the sync-free path):
    it goes out with programmatic dependent launch, so its blocks are scheduled while the
    lookup runs and start the moment it ends (``_loader.launch_dependent``).
    early: on the sync-free path (``lookup(host_totals=False)`` before) with the copy rule
    (copy_blocks 0) and sparse misses (at most 1024 a request on average), the first 16 copy
    blocks (48, copying by 16-byte loads, where the call misses at most 16384 rows in all:
    resolver_copy.cuh copy_few) wait for every request's miss count instead of the whole
    lookup and issue their first host reads then, while the lookup chooses victims
    (``R_PRELOADS`` counts the blocks that did); calls whose rows go by TMA (``tma``) issue
    bulk copies then only in the build with DHISPARSE_RESOLVER_TMA_PRELOAD=1, else those
    blocks prefetch their first round of rows into L2 and the copies go out after the
    lookup; None =
    ``default_copy_early()``. The call's tag is a kernel argument:
    a CUDA graph replaying the two launches would reuse it, so this path is not for graph
    capture with early on.
    tma: copy the misses by the tensor memory accelerator (True: always, False: never; None
    = ``DHISPARSE_COPY_TMA``: auto by default, from 8192 rows on for rows of whole 128-byte
    lines, except a call with few sparse misses, which copies by loads; ``copy_tma``)."""
    batch, k_queries, k = _check_round(ws, table, selections, locations, hot_slots)
    check("stage_locs", stage_locs, torch.int64, 1, "cuda")
    for name, t in (("out.batch", out.batch), ("out.rows", out.rows), ("out.dst", out.dst)):
        check(name, t, torch.int64, 1, "cuda")
        check_limit(f"copies fitting {name}", batch * k_queries * k, t.numel())
    # staged rows are written beside their stage_locs; more than either bound aborts the
    # commit (ST_STAGING) or cannot happen (every staged row is a miss)
    check("out.staged_rows", out.staged_rows, torch.int64, 1, "cuda")
    check_limit("staged rows fitting out.staged_rows",
                min(stage_locs.numel(), batch * k_queries * k), out.staged_rows.numel())
    layers = 0 if host_ptrs is None else host_ptrs.shape[0]
    if layers:
        check("host_ptrs", host_ptrs, torch.int64, 2, "cuda")
        check("payloads", payloads, torch.int64, 1, "cuda")
        if host_ptrs.shape[1] != batch or payloads.numel() != layers:
            raise InvalidArgument(
                f"host_ptrs {tuple(host_ptrs.shape)} / payloads {tuple(payloads.shape)} "
                f"must be [L, batch={batch}] / [L]"
            )
    w = vec_width(row_bytes)
    dev = selections.device.index
    # copies by TMA from this many rows on (-1: never)
    tma_from = copy_tma(tma, row_bytes, w, capability(dev)) if layers else -1
    # a call that cannot reach that many (every entry a miss) takes the kernel without TMA
    tma_kernel = 0 <= tma_from <= batch * k_queries * k * layers
    # the TMA rows' buffers take the static shared memory past the default 48 KB: opt in
    fn = kernel("resolver", f"resolve_commit_{w}{'_tma' if tma_kernel else ''}", dev, tma_kernel,
                defines())
    null = np.uint64(0)
    args = (
        ptr(table),
        ptr(selections),
        ptr(locations),
        *ws.pointers(),
        ptr(stage_locs),
        np.int64(stage_locs.numel()),
        ptr(out.batch),
        ptr(out.rows),
        ptr(out.dst),
        ptr(out.staged_rows),
        ptr(host_ptrs) if layers else null,
        ptr(payloads) if layers else null,
        np.int32(layers),
        np.int32(batch),
        np.int32(k_queries),
        np.int32(k),
        np.int32(hot_slots),
        np.uint32(row_bytes),
        np.int64(epoch),
    )
    if copy_blocks is None:
        copy_blocks = default_copy_blocks()
    if not 0 <= copy_blocks <= MAX_COPY_BLOCKS:
        raise InvalidArgument(f"copy_blocks={copy_blocks} must be in [0, {MAX_COPY_BLOCKS}]")
    if parts is None:
        parts = default_commit_parts()
    check_limit("parts", parts, MAX_COMMIT_PARTS)
    parts = parts or commit_parts_rule(batch, sm_count(dev))
    if ws.commit_sums and early is None:  # the setting matters (and is read) there only
        early = default_copy_early()
    args += (np.int32(copy_blocks), np.int32(ws.commit_sums), np.int32(parts),
             np.int32(ws.parity), np.int32(ws.call if early and ws.commit_sums else 0),
             np.int32(max(tma_from, 0)))
    copies = copy_blocks or launched_copy_blocks(batch * parts, sm_count(dev))
    grid = batch * parts + (copies if layers else 0)
    shared = TMA_ROWS * row_bytes if tma_kernel else 0  # the TMA rows' buffers
    if dependent:
        launch_dependent(fn, (grid,), (COMMIT_THREADS,), args, shared)
    else:
        launch(fn, (grid,), (COMMIT_THREADS,), args, shared)


def plan_copy(
    payload: torch.Tensor,
    copy_batch: torch.Tensor,
    copy_rows: torch.Tensor,
    copy_dst: torch.Tensor,
    host_ptrs: torch.Tensor,
    count: int | torch.Tensor,
    row_bytes: int,
) -> None:
    """``payload[copy_dst[c]] = host[copy_batch[c]][copy_rows[c]]`` for c < count (an int, or
    an int64 device scalar -- e.g. ``ws.totals[1:2]`` -- so follower copies need no host read)."""
    check("payload", payload, torch.uint8, 2, "cuda")
    for name, t in (
        ("copy_batch", copy_batch),
        ("copy_rows", copy_rows),
        ("copy_dst", copy_dst),
        ("host_ptrs", host_ptrs),
    ):
        check(name, t, torch.int64, 1, "cuda")
    if payload.shape[1] != row_bytes:
        raise InvalidArgument(
            f"payload rows have {payload.shape[1]} bytes; expected row_bytes={row_bytes}"
        )
    dev = payload.device.index
    w = vec_width(row_bytes, payload)
    on_device = isinstance(count, torch.Tensor)
    if on_device:
        check("count", count, torch.int64, 1, "cuda")
        if count.numel() < 1:
            raise InvalidArgument("count is an empty tensor; expected one int64 value")
    n = copy_rows.numel() if on_device else int(count)
    check_limit("count", n, copy_rows.numel())
    for name, t in (("copy_batch", copy_batch), ("copy_dst", copy_dst)):
        check_limit(f"count (entries of {name})", n, t.numel())
    grid = max(1, min(-(-n * row_bytes // w // 256), sm_count(dev) * 8))
    args = (
        ptr(payload),
        ptr(copy_batch),
        ptr(copy_rows),
        ptr(copy_dst),
        ptr(host_ptrs),
        ptr(count) if on_device else np.uint64(0),
        np.int64(0 if on_device else n),
        np.uint32(row_bytes),
    )
    launch(kernel("resolver", f"plan_copy_{w}", dev), (grid,), (256,), args)
