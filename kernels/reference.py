"""Torch reference of every copy kernel (plain index_select / index_copy): runs on CPU.

Each function has the signature of its kernel twin in ``kernels.copy`` and mutates
``dst`` in place; tests compare the two bit for bit.
"""

from __future__ import annotations

import torch


def gather_rows(
    dst: torch.Tensor, dst_idx: torch.Tensor, src: torch.Tensor, src_idx: torch.Tensor
) -> None:
    """``dst[dst_idx[i]] = src[src_idx[i]]`` (rows of ``uint8 [n, row_bytes]``)."""
    rows = src.index_select(0, src_idx.to(src.device)).to(dst.device)
    dst.index_copy_(0, dst_idx.to(dst.device), rows)


def gather_layers(dsts, dst_idx: torch.Tensor, srcs, src_idx: torch.Tensor) -> None:
    """One plan applied to several payload layers (follower copies)."""
    for dst, src in zip(dsts, srcs, strict=True):
        gather_rows(dst, dst_idx, src, src_idx)


def page_rows_view(t: torch.Tensor, page_rows: int) -> torch.Tensor:
    """View ``uint8 [n_pages * page_rows, row_bytes]`` as ``[n_pages, page_rows * row_bytes]``."""
    return t.view(t.shape[0] // page_rows, page_rows * t.shape[1])


def copy_pages(
    dst: torch.Tensor,
    dst_pages: torch.Tensor,
    src: torch.Tensor,
    src_pages: torch.Tensor,
    page_rows: int,
) -> None:
    """Whole pages (populate: host -> device; backup: device -> host)."""
    gather_rows(
        page_rows_view(dst, page_rows), dst_pages, page_rows_view(src, page_rows), src_pages
    )


def ring_write(
    ring: torch.Tensor,
    ring_index: torch.Tensor,
    positions: torch.Tensor,
    src: torch.Tensor,
    ring_rows: int,
) -> None:
    """Draft ring rows ``phi(i, t) = i * R_d + (t mod R_d)`` (paper eq. 10) := ``src``."""
    dst_idx = ring_index * ring_rows + torch.remainder(positions, ring_rows)
    ring.index_copy_(0, dst_idx.to(ring.device), src.to(ring.device))


def commit_rows(
    dst: torch.Tensor,
    dst_idx: torch.Tensor,
    src: torch.Tensor,
    src_idx: torch.Tensor,
    accepted: torch.Tensor,
) -> None:
    """Entry ``(b, j)`` of ``[batch, K]``: ``dst[dst_idx[b,j]] = src[src_idx[b,j]]``.

    Only where ``j < accepted[b]``."""
    keep = torch.arange(dst_idx.shape[1], device=dst_idx.device)[None, :] < accepted[:, None]
    gather_rows(dst, dst_idx[keep], src, src_idx[keep])
