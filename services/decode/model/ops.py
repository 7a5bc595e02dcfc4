"""Numerical building blocks of the reference model, shared by the target and the drafter.

Batch invariance: in the batch-invariant mode every row-wise stage runs once per row on a
fresh ``[1, n]`` tensor (``rowwise``), and every per-query stage (indexer scores, top-k,
attention) runs on tensors whose shapes depend only on that query (its position ``t`` and
``min(k, t)``), never on the batch or on the rest of its verification block. BLAS and
vectorized kernels then see identical shapes, strides, alignment and values, so a query
computes the same bits alone, in a batch, or inside a K-query round.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

EPS = 1e-6


def rowwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
            invariant: bool) -> torch.Tensor:
    """``fn`` over ``x [N, n]``; with ``invariant`` one fresh ``[1, n]`` row at a time."""
    if not invariant or x.shape[0] <= 1:
        return fn(x.clone() if invariant else x)
    return torch.cat([fn(x[i: i + 1].clone()) for i in range(x.shape[0])])


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [N, n]`` → normalized ``[N, n]`` (statistics in fp32)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return y.to(x.dtype) * weight


def mlp(x: torch.Tensor, norm: torch.Tensor, w_up: torch.Tensor,
        w_down: torch.Tensor) -> torch.Tensor:
    """Pre-norm SiLU MLP: ``x [N, width]`` → residual update ``[N, width]``."""
    return torch.nn.functional.silu(rms_norm(x, norm) @ w_up) @ w_down


def select_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Top-``min(k, t)`` positions of ``scores [t]``, ordered by (score desc, position asc).

    Tie handling is part of the model: a stable descending sort keeps equal scores in
    position order, so the selection and its order are a pure function of ``scores``.
    """
    kk = min(k, scores.shape[0])
    return torch.sort(scores, descending=True, stable=True).indices[:kk]


def index_scores(keys: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Lightning-indexer scores: ``keys [t, d]``, ``q [H, d]``, ``w [H]`` → ``[t]``."""
    return w.float() @ torch.relu(q @ keys.T).float()


def attend(q: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """MLA-like attention with K = V = latent: ``q [H, D]``, ``rows [n, D]`` → ``[H·D]``."""
    s = (q @ rows.T).float() * rows.shape[-1] ** -0.5  # [H, n]
    p = torch.softmax(s, dim=-1).to(rows.dtype)
    return (p @ rows).flatten()
