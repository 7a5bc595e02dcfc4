"""Acceptance rules of a verification round (unchanged from the proposal methods).

Shapes: ``tokens int64 [B, K]`` (column 0 the anchor, 1.. the proposals; columns
``>= K_r`` padding), ``num_queries int64 [B]`` (``K_r``), target scores for every query
``[B, K, V]`` (query j predicts the token after ``x_j``), draft probabilities of each
proposal ``[B, K − 1, V]``. Result: ``accepted [B]`` (A_r) and ``bonus [B]`` (b_r).

* greedy: accept while ``x_{j+1} == argmax target_j`` (first index on ties); ``b`` is the
  target argmax after the last accepted token (a correction, or the bonus if all pass).
* speculative sampling (Leviathan et al., 2023): accept ``x_{j+1}`` with probability
  ``min(1, p_j(x)/q_j(x))``; at the first rejection sample ``b`` from the normalized
  residual ``max(0, p_j − q_j)``; if all pass sample the bonus from ``p_{K_r−1}``.
  Randomness comes from explicit generators; with one generator per request the draws of a
  request do not depend on the rest of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.common.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: torch.Tensor  # int64 [B]
    bonus: torch.Tensor     # int64 [B]


def _check(tokens: torch.Tensor, num_queries: torch.Tensor, target: torch.Tensor,
           k_max: int) -> None:
    if tokens.dim() != 2:
        raise InvalidArgument(f"tokens.dim()={tokens.dim()} must be 2 ([B, K])")
    B, K = tokens.shape
    if K > k_max:
        raise InvalidArgument(f"K={K} must be <= k_max={k_max}")
    if tuple(num_queries.shape) != (B,):
        raise InvalidArgument(f"num_queries.shape={tuple(num_queries.shape)} must be ({B},)")
    if bool(((num_queries < 1) | (num_queries > K)).any()):
        raise InvalidArgument(f"num_queries={num_queries.tolist()} must be in 1..{K}")
    if target.dim() != 3 or tuple(target.shape[:2]) != (B, K):
        raise InvalidArgument(f"target.shape={tuple(target.shape)} must be ({B}, {K}, V)")


def _proposal_mask(num_queries: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, width]``: proposal ``j + 1`` exists (``j + 1 < K_r``)."""
    return torch.arange(1, width + 1, device=num_queries.device) < num_queries.view(-1, 1)


def _leading(ok: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of each row of ``ok bool [B, n]`` → ``int64 [B]``."""
    return ok.to(torch.int64).cumprod(dim=1).sum(dim=1)


def greedy_accept(tokens: torch.Tensor, num_queries: torch.Tensor,
                  target_logits: torch.Tensor, k_max: int) -> Verdict:
    _check(tokens, num_queries, target_logits, k_max)
    K = tokens.shape[1]
    best = target_logits.argmax(dim=-1)  # [B, K]
    match = (tokens[:, 1:] == best[:, : K - 1]) & _proposal_mask(num_queries, K - 1)
    a = _leading(match)
    return Verdict(a, best.gather(1, a.view(-1, 1)).view(-1))


def _uniforms(generator: torch.Generator | Sequence[torch.Generator], B: int, K: int,
              device: torch.device, num_queries: torch.Tensor) -> torch.Tensor:
    """``[B, K, 2]`` uniforms: (accept test, resample) per query; per-request if a list.

    A request's generator gives exactly ``num_queries[b]`` pairs (the rest is 0, never
    read): its random stream then depends on its own K_r only, so a request decoded with
    K_r = 1 draws what a non-speculative worker draws, whatever the batch's K."""
    if isinstance(generator, torch.Generator):
        return torch.rand(B, K, 2, generator=generator).to(device)
    if len(generator) != B:
        raise InvalidArgument(f"len(generators)={len(generator)} must be B={B}")
    out = torch.zeros(B, K, 2)
    for b, (g, n) in enumerate(zip(generator, num_queries.tolist(), strict=True)):
        out[b, :n] = torch.rand(n, 2, generator=g)
    return out.to(device)


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sample: ``probs [B, V]`` (unnormalized, >= 0), ``u [B]`` in [0, 1)."""
    cdf = probs.double().cumsum(dim=-1)
    x = torch.searchsorted(cdf, (u.double() * cdf[:, -1]).view(-1, 1), right=True)
    return x.view(-1).clamp_max(probs.shape[-1] - 1)


def speculative_accept(tokens: torch.Tensor, num_queries: torch.Tensor,
                       target_probs: torch.Tensor, draft_probs: torch.Tensor,
                       generator: torch.Generator | Sequence[torch.Generator],
                       k_max: int) -> Verdict:
    _check(tokens, num_queries, target_probs, k_max)
    B, K = tokens.shape
    if tuple(draft_probs.shape) != (B, K - 1, target_probs.shape[-1]):
        raise InvalidArgument(f"draft_probs.shape={tuple(draft_probs.shape)} must be "
                              f"({B}, {K - 1}, {target_probs.shape[-1]})")
    u = _uniforms(generator, B, K, tokens.device, num_queries)
    x = tokens[:, 1:].clamp_min(0).unsqueeze(-1)  # [B, K-1, 1]
    p_x = target_probs[:, : K - 1].gather(2, x).squeeze(-1).double()
    q_x = draft_probs.gather(2, x).squeeze(-1).double()
    ok = (u[:, : K - 1, 0].double() * q_x < p_x) & _proposal_mask(num_queries, K - 1)
    a = _leading(ok)
    rows = torch.arange(B, device=tokens.device)
    p_a = target_probs[rows, a].double()
    rejected = a < num_queries - 1
    q_a = torch.zeros_like(p_a)
    q_a[rejected] = draft_probs[rows[rejected], a[rejected]].double()
    residual = (p_a - q_a).clamp_min(0)
    empty = residual.sum(-1) <= 0  # p == q at a rejection has probability 0; fall back to p
    residual[empty] = p_a[empty]
    return Verdict(a, sample_from(residual, u[rows, a, 1]))
