"""Typed wrappers of ``copy.cu``: row gathers over mapped host or device memory.

Every function checks its arguments (InvalidArgument naming argument, value and limit),
then launches on ``torch.cuda.current_stream()``; none synchronizes with the host.
Torch twins with the same signatures live in ``kernels.reference``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from services.common.errors import InvalidArgument

from ._loader import check, check_limit, kernel, launch, ptr, sm_count, vec_width

THREADS = 256
BLOCKS_PER_SM = 8  # 8 x 256 threads = the SM's 2048 threads at <= 32 registers (ptxas -v)
MAX_ITEMS = 2**31 - 1  # items (vectors) are counted in 32 bits


def _grid(items: int, device: int) -> int:
    return max(1, min(-(-items // THREADS), sm_count(device) * BLOCKS_PER_SM))


def _rows(name: str, t: object) -> torch.Tensor:
    return check(name, t, torch.uint8, 2, "mapped")


def _index(name: str, t: object, dims: int = 1) -> torch.Tensor:
    return check(name, t, torch.int64, dims, "cuda")


def _same_width(dst: torch.Tensor, src: torch.Tensor) -> int:
    if dst.shape[1] != src.shape[1]:
        raise InvalidArgument(f"dst rows have {dst.shape[1]} bytes; expected src's {src.shape[1]}")
    return dst.shape[1]


def gather_rows(
    dst: torch.Tensor, dst_idx: torch.Tensor, src: torch.Tensor, src_idx: torch.Tensor
) -> None:
    """``dst[dst_idx[i]] = src[src_idx[i]]``; either side may be pinned host memory.

    Sort the work list by ``src_idx`` first when ``src`` is host memory (address order
    is ~2x faster for 656-byte rows; see copy.cu). Indices are trusted (not bounds-checked).
    """
    _rows("dst", dst)
    _rows("src", src)
    _index("dst_idx", dst_idx)
    _index("src_idx", src_idx)
    if dst_idx.shape != src_idx.shape:
        raise InvalidArgument(
            f"dst_idx has shape={tuple(dst_idx.shape)}; expected src_idx's {tuple(src_idx.shape)}"
        )
    row_bytes = _same_width(dst, src)
    w, n = vec_width(row_bytes, dst, src), dst_idx.numel()
    check_limit("rows * row_bytes / vector", n * row_bytes // w, MAX_ITEMS)
    if n == 0:
        return
    dev = dst_idx.device.index
    fn = kernel("copy", f"gather_rows_{w}", dev)
    args = (ptr(dst), ptr(dst_idx), ptr(src), ptr(src_idx), np.uint32(n), np.uint32(row_bytes))
    launch(fn, (_grid(n * row_bytes // w, dev),), (THREADS,), args)


def gather_layers(
    dsts: Sequence[torch.Tensor],
    dst_idx: torch.Tensor,
    srcs: Sequence[torch.Tensor],
    src_idx: torch.Tensor,
) -> None:
    """One plan, several payload layers (GLM-like followers): one launch, grid.y = layer."""
    if len(dsts) != len(srcs) or not dsts:
        raise InvalidArgument(f"dsts has {len(dsts)} layers; expected srcs' {len(srcs)} (>= 1)")
    _index("dst_idx", dst_idx)
    _index("src_idx", src_idx)
    for i, (d, s) in enumerate(zip(dsts, srcs, strict=True)):
        _rows(f"dsts[{i}]", d)
        _rows(f"srcs[{i}]", s)
        _same_width(d, s)
    row_bytes, n = dsts[0].shape[1], dst_idx.numel()
    if any(d.shape[1] != row_bytes for d in dsts) or dst_idx.shape != src_idx.shape:
        raise InvalidArgument("every layer must share row_bytes and the index shapes must match")
    w = vec_width(row_bytes, *dsts, *srcs)
    check_limit("rows * row_bytes / vector", n * row_bytes // w, MAX_ITEMS)
    check_limit("layers", len(dsts), 65535)
    if n == 0:
        return
    dev = dst_idx.device.index
    ptrs = torch.tensor(
        [[t.data_ptr() for t in dsts], [t.data_ptr() for t in srcs]], dtype=torch.int64
    )
    ptrs = ptrs.pin_memory().to(dst_idx.device, non_blocking=True)
    fn = kernel("copy", f"gather_layers_{w}", dev)
    args = (
        ptr(ptrs[0]),
        ptr(dst_idx),
        ptr(ptrs[1]),
        ptr(src_idx),
        np.uint32(n),
        np.uint32(row_bytes),
    )
    launch(fn, (_grid(n * row_bytes // w, dev), len(dsts)), (THREADS,), args)


def copy_pages(
    dst: torch.Tensor,
    dst_pages: torch.Tensor,
    src: torch.Tensor,
    src_pages: torch.Tensor,
    page_rows: int,
) -> None:
    """Whole pages of ``page_rows`` rows: populate (host -> device pool) or backup (pool ->
    mapped host). ``dst``/``src``: ``uint8 [pages * page_rows, row_bytes]``."""
    for name, t in (("dst", dst), ("src", src)):
        _rows(name, t) if not isinstance(t, torch.Tensor) or t.dim() != 2 else None
        if page_rows <= 0 or t.shape[0] % page_rows:
            raise InvalidArgument(
                f"{name} has {t.shape[0]} rows; expected a multiple of page_rows={page_rows}"
            )
    view = lambda t: t.view(t.shape[0] // page_rows, page_rows * t.shape[1])
    gather_rows(view(dst), dst_pages, view(src), src_pages)


def ring_write(
    ring: torch.Tensor,
    ring_index: torch.Tensor,
    positions: torch.Tensor,
    src: torch.Tensor,
    ring_rows: int,
) -> None:
    """Draft ring (eq. 10): ``ring[i * R_d + (t mod R_d)] = src[j]``.

    ``(i, t) = (ring_index[j], positions[j])``."""
    check("ring", ring, torch.uint8, 2, "cuda")
    _rows("src", src)
    _index("ring_index", ring_index)
    _index("positions", positions)
    if ring_index.shape != positions.shape or positions.numel() != src.shape[0]:
        raise InvalidArgument(
            f"ring_index {tuple(ring_index.shape)}, positions {tuple(positions.shape)} and "
            f"src rows {src.shape[0]} must agree"
        )
    if ring_rows <= 0:
        raise InvalidArgument(f"ring_rows={ring_rows} must be > 0")
    row_bytes, n = _same_width(ring, src), src.shape[0]
    w = vec_width(row_bytes, ring, src)
    check_limit("rows * row_bytes / vector", n * row_bytes // w, MAX_ITEMS)
    if n == 0:
        return
    dev = ring.device.index
    args = (
        ptr(ring),
        ptr(ring_index),
        ptr(positions),
        ptr(src),
        np.uint32(n),
        np.uint32(row_bytes),
        np.int64(ring_rows),
    )
    launch(
        kernel("copy", f"ring_write_{w}", dev), (_grid(n * row_bytes // w, dev),), (THREADS,), args
    )


def commit_rows(
    dst: torch.Tensor,
    dst_idx: torch.Tensor,
    src: torch.Tensor,
    src_idx: torch.Tensor,
    accepted: torch.Tensor,
) -> None:
    """Accepted speculative rows: entry ``(b, j)`` copies iff ``j < accepted[b]`` (on device)."""
    _rows("dst", dst)
    _rows("src", src)
    _index("dst_idx", dst_idx, 2)
    _index("src_idx", src_idx, 2)
    _index("accepted", accepted)
    if dst_idx.shape != src_idx.shape or accepted.shape[0] != dst_idx.shape[0]:
        raise InvalidArgument(
            f"dst_idx {tuple(dst_idx.shape)}, src_idx {tuple(src_idx.shape)} and accepted "
            f"{tuple(accepted.shape)} must be [batch, K], [batch, K], [batch]"
        )
    row_bytes = _same_width(dst, src)
    (batch, k_max), w = dst_idx.shape, vec_width(row_bytes, dst, src)
    check_limit("entries * row_bytes / vector", batch * k_max * row_bytes // w, MAX_ITEMS)
    if batch * k_max == 0:
        return
    dev = dst_idx.device.index
    args = (
        ptr(dst),
        ptr(dst_idx),
        ptr(src),
        ptr(src_idx),
        ptr(accepted),
        np.uint32(batch),
        np.uint32(k_max),
        np.uint32(row_bytes),
    )
    launch(
        kernel("copy", f"commit_rows_{w}", dev),
        (_grid(batch * k_max * row_bytes // w, dev),),
        (THREADS,),
        args,
    )


def on_side_stream(
    side: torch.cuda.Stream, fn: Callable[..., None], *args: torch.Tensor
) -> torch.cuda.Event:
    """Run ``fn(*args)`` on ``side`` after the current stream's queued work; returns the
    event to ``wait_event`` on before reading what ``fn`` wrote (follower-layer copies
    overlap the computation of the layers in between)."""
    main = torch.cuda.current_stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        fn(*args)
        done = torch.cuda.Event()
        done.record(side)
    for t in args:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            t.record_stream(side)
    return done
