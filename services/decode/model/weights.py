"""Deterministic random weights of the reference model, drawn from ``cfg.seed``.

Weights are drawn on the CPU in fp32 from one ``torch.Generator`` in a fixed order, then
moved to ``cfg.device`` / ``cfg.dtype``: the same seed gives the same weights on every
device. Projections are stored ``[in, out]`` (``y = x @ w``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.decode.model.config import ModelConfig


@dataclass(slots=True)
class LayerWeights:
    """One layer: attention over latent rows (K = V = latent) and a SiLU MLP."""

    attn_norm: torch.Tensor  # [width]
    wq: torch.Tensor         # [width, heads·latent]
    wkv: torch.Tensor        # [width, latent]   (used where the layer produces a payload)
    wo: torch.Tensor         # [heads·latent, width]
    mlp_norm: torch.Tensor   # [width]
    w_up: torch.Tensor       # [width, mlp]
    w_down: torch.Tensor     # [mlp, width]


@dataclass(slots=True)
class IndexerWeights:
    """One group's lightning indexer: ``I[t,s] = Σ_h w_h(t) · relu(q_h(t) · k(s))``."""

    wq: torch.Tensor  # [width, index_heads·index_dim]
    wk: torch.Tensor  # [width, index_dim]
    ww: torch.Tensor  # [width, index_heads]


@dataclass(slots=True)
class Weights:
    embed: torch.Tensor       # [vocab, width]
    layers: list[LayerWeights]
    indexers: list[IndexerWeights]  # one per group
    final_norm: torch.Tensor  # [width]
    lm_head: torch.Tensor     # [width, vocab]


def init_weights(cfg: ModelConfig) -> Weights:
    """Draw every weight from ``torch.Generator().manual_seed(cfg.seed)``."""
    gen = torch.Generator().manual_seed(cfg.seed)

    def proj(n_in: int, n_out: int) -> torch.Tensor:
        w = torch.randn(n_in, n_out, generator=gen) / n_in**0.5
        return w.to(device=cfg.device, dtype=cfg.torch_dtype)

    def out_proj(n_in: int, n_out: int) -> torch.Tensor:
        return proj(n_in, n_out) * cfg.residual_scale

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=cfg.device, dtype=cfg.torch_dtype)

    w, hd = cfg.width, cfg.heads * cfg.latent_dim
    embed = torch.randn(cfg.vocab, w, generator=gen).to(cfg.device, cfg.torch_dtype)
    layers = [
        LayerWeights(ones(w), proj(w, hd), proj(w, cfg.latent_dim), out_proj(hd, w), ones(w),
                     proj(w, cfg.mlp_width), out_proj(cfg.mlp_width, w))
        for _ in range(cfg.layers)
    ]
    indexers = [
        IndexerWeights(proj(w, cfg.index_heads * cfg.index_dim), proj(w, cfg.index_dim),
                       proj(w, cfg.index_heads))
        for _ in range(cfg.groups)
    ]
    return Weights(embed, layers, indexers, ones(w), proj(w, cfg.vocab))
