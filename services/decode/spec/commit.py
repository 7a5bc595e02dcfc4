"""Commit math of a verification round (paper eq. 7–8), as pure functions.

Round of request r: anchor ``x_0`` at position ``n``, proposals ``x_1 .. x_{K_r−1}``;
acceptance keeps ``A`` proposals and emits ``b`` (correction, or bonus when A = K_r − 1)::

    new output        = [x_1 .. x_A, b]
    committed prefix  = [x_0 .. x_A]          (their rows become immutable history)
    n'                = n + 1 + A             (b has no row until the next forward)
    completed rows    = floor(n/m) <= s < floor(n'/m)   for a source packing m positions/row
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.common.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class Commit:
    new_output: list[int]
    committed_prefix: list[int]
    n_committed: int


def check_round(num_queries: int, accepted: int, k_max: int) -> None:
    """``1 <= K_r <= K_max`` and ``0 <= A <= K_r − 1``, else ``InvalidArgument``."""
    if not 1 <= num_queries <= k_max:
        raise InvalidArgument(f"num_queries={num_queries} must be in 1..k_max={k_max}")
    if not 0 <= accepted <= num_queries - 1:
        raise InvalidArgument(f"accepted={accepted} must be in 0..num_queries-1="
                              f"{num_queries - 1}")


def commit_round(n: int, tokens: Sequence[int], accepted: int, bonus: int,
                 k_max: int) -> Commit:
    """Eq. 7 for one request: ``tokens = [x_0 .. x_{K_r−1}]`` at positions ``n ..``."""
    if n < 0:
        raise InvalidArgument(f"n={n} must be >= 0")
    check_round(len(tokens), accepted, k_max)
    toks = [int(t) for t in tokens]
    return Commit([*toks[1: accepted + 1], int(bonus)], toks[: accepted + 1], n + 1 + accepted)


def commit_batch(n: torch.Tensor, num_queries: torch.Tensor, accepted: torch.Tensor,
                 k_max: int) -> torch.Tensor:
    """Eq. 7 for a batch: ``int64 [B]`` each → ``n' = n + 1 + A`` ``[B]`` (validated)."""
    if not (n.shape == num_queries.shape == accepted.shape) or n.dim() != 1:
        raise InvalidArgument(f"n, num_queries, accepted shapes {tuple(n.shape)}, "
                              f"{tuple(num_queries.shape)}, {tuple(accepted.shape)} must "
                              "be equal [B]")
    for kr, a in zip(num_queries.tolist(), accepted.tolist(), strict=True):
        check_round(kr, a, k_max)
    if bool((n < 0).any()):
        raise InvalidArgument(f"n={n.tolist()} must be >= 0")
    return n + 1 + accepted


def completed_rows(n: int, n_new: int, positions_per_row: int = 1) -> range:
    """Eq. 8: source rows completed by the round, ``floor(n/m) <= s < floor(n'/m)``."""
    m = positions_per_row
    if m < 1:
        raise InvalidArgument(f"positions_per_row={m} must be >= 1")
    if not 0 <= n <= n_new:
        raise InvalidArgument(f"n={n}, n_new={n_new} must satisfy 0 <= n <= n_new")
    return range(n // m, n_new // m)
