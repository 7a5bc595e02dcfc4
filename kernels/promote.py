"""Staging promotion of one wave (``resolver_promote.cu``): the typed wrapper and its
shared-memory sizing; the torch definition is ``services.decode.hierarchy.promotion``."""

from __future__ import annotations

import numpy as np
import torch

from services.common.errors import InvalidArgument

from ._loader import check, check_limit, dynamic_shared_cap, kernel, launch, ptr, vec_width
from .resolver import LOOKUP_THREADS, MAX_SLOTS, T_COLS, bitmap_words, defines, sort_size


def promote_shared_bytes(hot_slots: int, rows_bound: int) -> int:
    """Dynamic shared memory of ``promote``: sort keys, two row bitmaps, slot ranks."""
    return 8 * sort_size(hot_slots) + 8 * bitmap_words(rows_bound) + 4 * max(hot_slots, 1)


def promote_fits(hot_slots: int, rows_bound: int, row_bytes: int, device: int) -> bool:
    """Whether ``promote`` can run these sizes (its shared memory fits the SM's opt-in)."""
    fn = kernel("resolver", f"promote_staged_{vec_width(row_bytes)}", device, True, defines())
    return promote_shared_bytes(hot_slots, rows_bound) <= dynamic_shared_cap(fn, device)


def promote(
    table: torch.Tensor,
    rows: torch.Tensor,
    locs: torch.Tensor,
    offsets: torch.Tensor,
    epochs: torch.Tensor,
    slot_of: torch.Tensor,
    promoted: torch.Tensor,
    payload_ptrs: torch.Tensor,
    *,
    hot_slots: int,
    rows_bound: int,
    finished_epoch: int,
    row_bytes: int,
) -> None:
    """Staging promotion of one wave (resolver_promote.cu): block b moves the staged rows
    ``rows[offsets[b]:offsets[b+1]]`` (arena rows ``locs``, staged at ``epochs[b]``) of
    request table row b into its LRU hot slots and copies their payload rows in every
    layer of ``payload_ptrs`` (int64 [L] base addresses). Writes ``slot_of`` (int32, the
    slot each row took, -1 = not promoted) and ``promoted`` (int64 [blocks]). Requests of
    one wave must be distinct; every staged row must lie in ``[0, rows_bound)`` (not
    checked on the device: ``kernels.dropin`` passes the largest staged row + 1); hot rows
    outside that range are never equal to a staged row and are ignored."""
    check("table", table, torch.int64, 2, "cuda")
    for name, t in (("rows", rows), ("locs", locs), ("offsets", offsets), ("epochs", epochs),
                    ("promoted", promoted), ("payload_ptrs", payload_ptrs)):
        check(name, t, torch.int64, 1, "cuda")
    check("slot_of", slot_of, torch.int32, 1, "cuda")
    blocks = table.shape[0]
    if (table.shape[1] != T_COLS or offsets.numel() != blocks + 1 or epochs.numel() != blocks
            or promoted.numel() < blocks or locs.numel() != rows.numel()
            or slot_of.numel() < rows.numel()):
        raise InvalidArgument(
            f"table {tuple(table.shape)}, offsets {offsets.numel()}, epochs {epochs.numel()}, "
            f"promoted {promoted.numel()}, rows/locs/slot_of {rows.numel()}/{locs.numel()}/"
            f"{slot_of.numel()} must be [blocks, {T_COLS}], blocks + 1, blocks, >= blocks, "
            f"one entry per staged row"
        )
    check_limit("hot_slots", hot_slots, MAX_SLOTS)
    if blocks == 0:
        return
    words, pow2 = bitmap_words(rows_bound), sort_size(hot_slots)
    shared = promote_shared_bytes(hot_slots, rows_bound)
    dev = table.device.index
    w = vec_width(row_bytes)
    fn = kernel("resolver", f"promote_staged_{w}", dev, True, defines())
    check_limit("shared bytes (8 * pow2(B) + 8 * ceil(rows_bound / 32) + 4 * B)", shared,
                dynamic_shared_cap(fn, dev))
    args = (
        ptr(table), ptr(rows), ptr(locs), ptr(offsets), ptr(epochs), ptr(slot_of),
        ptr(promoted), ptr(payload_ptrs), np.int32(payload_ptrs.numel()), np.uint32(row_bytes),
        np.int32(hot_slots), np.int32(pow2), np.int32(words), np.int64(finished_epoch),
    )
    launch(fn, (blocks,), (LOOKUP_THREADS,), args, shared)
