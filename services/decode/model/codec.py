"""Payload rows and index keys as raw bytes: ``encode_*`` / ``decode_*``.

Every stored row is ``uint8 [..., row_bytes]``; the model decodes what it reads and encodes
what it writes, so a row read back from any tier is bit-identical to the row produced.

``raw``      ``[latent_dim × dtype]``  — the compute values' bytes (fp32: 4 B/elem, bf16: 2).
``fp8_mla``  ``[nope fp8_e4m3 | nope/128 × fp32 scale | rope × bf16]`` (DeepSeek FP8 MLA).
``fp8`` key  ``[index_dim fp8_e4m3 | fp32 scale]``.

All functions are elementwise per row, so a row's bytes never depend on its neighbours.
"""

from __future__ import annotations

import torch

from services.decode.model.config import FP8_TILE, ModelConfig

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def _as_bytes(x: torch.Tensor) -> torch.Tensor:
    """``x [..., n]`` of any dtype → ``uint8 [..., n·itemsize]`` (a copy, contiguous)."""
    return x.contiguous().view(torch.uint8).clone()


def _quantize(x: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., n]`` → (fp8 bytes ``[..., n]``, fp32 scale bytes ``[..., n/tile·4]``)."""
    t = x.float().unflatten(-1, (-1, tile))
    scale = (t.abs().amax(-1, keepdim=True) / FP8_MAX).clamp_min(1e-12)
    q = (t / scale).to(FP8).flatten(-2)
    return q.view(torch.uint8), _as_bytes(scale.squeeze(-1))


def _dequantize(q: torch.Tensor, scale: torch.Tensor, tile: int) -> torch.Tensor:
    """Inverse of ``_quantize``: fp8 bytes ``[..., n]`` + scale bytes → fp32 ``[..., n]``."""
    vals = q.contiguous().view(FP8).float().unflatten(-1, (-1, tile))
    s = scale.contiguous().view(torch.float32).unsqueeze(-1)
    return (vals * s).flatten(-2)


def encode_rows(cfg: ModelConfig, latent: torch.Tensor) -> torch.Tensor:
    """``latent [..., latent_dim]`` (compute dtype) → ``uint8 [..., row_bytes]``."""
    if cfg.row_format == "raw":
        return _as_bytes(latent.to(cfg.torch_dtype))
    nope = cfg.latent_dim - cfg.rope_dim
    q, s = _quantize(latent[..., :nope], FP8_TILE)
    rope = _as_bytes(latent[..., nope:].to(torch.bfloat16))
    return torch.cat([q, s, rope], dim=-1)


def decode_rows(cfg: ModelConfig, rows: torch.Tensor) -> torch.Tensor:
    """``uint8 [..., row_bytes]`` → ``latent [..., latent_dim]`` in the compute dtype."""
    if cfg.row_format == "raw":
        return rows.contiguous().view(cfg.torch_dtype)
    nope = cfg.latent_dim - cfg.rope_dim
    sb = 4 * (nope // FP8_TILE)
    vals = _dequantize(rows[..., :nope], rows[..., nope:nope + sb], FP8_TILE)
    rope = rows[..., nope + sb:].contiguous().view(torch.bfloat16).float()
    return torch.cat([vals, rope], dim=-1).to(cfg.torch_dtype)


def encode_keys(cfg: ModelConfig, keys: torch.Tensor) -> torch.Tensor:
    """Index keys ``[..., index_dim]`` → ``uint8 [..., index_key_bytes]``."""
    if cfg.index_format == "raw":
        return _as_bytes(keys.to(cfg.torch_dtype))
    q, s = _quantize(keys, cfg.index_dim)
    return torch.cat([q, s], dim=-1)


def decode_keys(cfg: ModelConfig, keys: torch.Tensor) -> torch.Tensor:
    """``uint8 [..., index_key_bytes]`` → keys ``[..., index_dim]`` in the compute dtype."""
    if cfg.index_format == "raw":
        return keys.contiguous().view(cfg.torch_dtype)
    d = cfg.index_dim
    return _dequantize(keys[..., :d], keys[..., d:], d).to(cfg.torch_dtype)
