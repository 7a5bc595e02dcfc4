"""Configuration of the reference DSA-style model (DESIGN.md §7) and its named presets.

Layers are cut into consecutive *groups* of ``group_size`` layers. The first layer of a
group is the group's index producer: its indexer selects top-k positions once and every
layer of the group attends over that selection. What the group's layers read differs by
``topology``::

    glm       group g = [L0 L1 L2 L3]   one selection, 4 payload sources (each layer its
              idx ^                     own latent rows: one selection, several copies)
    deepseek  group g = [L0 L1 L2 L3]   one selection, 1 payload source produced by L0 and
              idx ^ kv ^                read by all 4 layers (one copy, several readers)

A payload row is a layer's latent KV vector (MLA-like, K = V = latent) stored as raw bytes:
``raw`` = the compute dtype's bytes; ``fp8_mla`` = DeepSeek FP8 MLA layout (the first
``latent_dim - rope_dim`` dims as float8_e4m3 in 128-wide tiles with one fp32 scale per
tile, then ``rope_dim`` dims as bf16: 512 + 4·4 + 64·2 = 656 bytes). Index keys are ``raw``
or ``fp8`` (``index_dim`` fp8 values + one fp32 scale: 128 + 4 = 132 bytes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from services.common.errors import InvalidArgument

TOPOLOGIES = ("glm", "deepseek")
ROW_FORMATS = ("raw", "fp8_mla")
INDEX_FORMATS = ("raw", "fp8")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FP8_TILE = 128
"""Quantization tile of the fp8 layouts (DeepSeek FP8 MLA uses 128-wide tiles)."""


def _check_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidArgument(f"{name}={value!r} must be an integer >= {minimum}")


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidArgument(f"{name}={value!r} must be one of {', '.join(choices)}")


@dataclass(slots=True)
class ModelConfig:
    """Shape, sharing topology, storage layout and execution mode of the reference model."""

    vocab: int = 64
    layers: int = 4
    width: int = 32
    heads: int = 2
    latent_dim: int = 16
    rope_dim: int = 0
    index_heads: int = 2
    index_dim: int = 8
    top_k: int = 8
    mlp_width: int = 64
    topology: str = "glm"
    group_size: int = 2
    row_format: str = "raw"
    index_format: str = "raw"
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    batch_invariant: bool = False
    residual_scale: float = 1.0
    """Multiplier on every layer's residual projections (``wo``, ``w_down``) at init. Below 1
    the token embedding dominates the residual stream, so a drafter made of the first layers
    agrees with the target often enough for speculation to pay (random weights are not
    trained to agree): tiny/demo greedy runs emit ~1.5–2.3 tokens per K=4 round at 0.3."""

    def __post_init__(self) -> None:
        for name in ("vocab", "layers", "width", "heads", "latent_dim", "index_heads",
                     "index_dim", "top_k", "mlp_width", "group_size"):
            _check_int(name, getattr(self, name), 1)
        _check_int("rope_dim", self.rope_dim, 0)
        _check_int("seed", self.seed, 0)
        _check_choice("topology", self.topology, TOPOLOGIES)
        _check_choice("row_format", self.row_format, ROW_FORMATS)
        _check_choice("index_format", self.index_format, INDEX_FORMATS)
        _check_choice("dtype", self.dtype, tuple(DTYPES))
        if self.layers % self.group_size:
            raise InvalidArgument(f"layers={self.layers} must be a multiple of "
                                  f"group_size={self.group_size}")
        if self.rope_dim >= self.latent_dim:
            raise InvalidArgument(f"rope_dim={self.rope_dim} must be < "
                                  f"latent_dim={self.latent_dim}")
        if self.row_format == "fp8_mla" and (self.latent_dim - self.rope_dim) % FP8_TILE:
            raise InvalidArgument(f"latent_dim - rope_dim={self.latent_dim - self.rope_dim} "
                                  f"must be a multiple of {FP8_TILE} for row_format=fp8_mla")
        if self.row_format == "raw" and self.rope_dim:
            raise InvalidArgument(f"rope_dim={self.rope_dim} must be 0 for row_format=raw")
        if not (isinstance(self.residual_scale, int | float)
                and 0 < self.residual_scale <= 1):
            raise InvalidArgument(f"residual_scale={self.residual_scale!r} must be in (0, 1]")
        if not isinstance(self.batch_invariant, bool):
            raise InvalidArgument(f"batch_invariant={self.batch_invariant!r} must be a bool")

    # -- derived geometry -------------------------------------------------------------
    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def elem_bytes(self) -> int:
        return torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def groups(self) -> int:
        return self.layers // self.group_size

    @property
    def payloads_per_group(self) -> int:
        """Payload sources per group: ``group_size`` (glm) or 1 (deepseek)."""
        return self.group_size if self.topology == "glm" else 1

    def payload_of(self, layer: int) -> tuple[int, int]:
        """``(group, payload)`` whose rows ``layer`` attends over."""
        group, member = divmod(layer, self.group_size)
        return group, (member if self.topology == "glm" else 0)

    def produces_payload(self, layer: int) -> bool:
        return self.topology == "glm" or layer % self.group_size == 0

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored payload row (``d_KV``)."""
        if self.row_format == "raw":
            return self.latent_dim * self.elem_bytes
        nope = self.latent_dim - self.rope_dim
        return nope + 4 * (nope // FP8_TILE) + 2 * self.rope_dim

    @property
    def index_key_bytes(self) -> int:
        """Bytes of one index key kept on the device per position and group."""
        if self.index_format == "raw":
            return self.index_dim * self.elem_bytes
        return self.index_dim + 4

    def replace(self, **changes: object) -> ModelConfig:
        return dataclasses.replace(self, **changes)



def preset(name: str, **overrides: object) -> ModelConfig:
    """A named configuration (``tiny``, ``demo``, ``h200-deepseek``) with overrides."""
    if name not in _PRESET_ARGS:
        raise InvalidArgument(f"preset={name!r} must be one of {', '.join(_PRESET_ARGS)}")
    return ModelConfig(**{**_PRESET_ARGS[name], **overrides})


_PRESET_ARGS: dict[str, dict[str, object]] = {
    # CPU unit tests: 4 layers, 2 groups, k = 8.
    "tiny": dict(vocab=64, layers=4, width=32, heads=2, latent_dim=16, index_heads=2,
                 index_dim=8, top_k=8, mlp_width=64, group_size=2, residual_scale=0.3),
    # CPU demo / closed-loop benchmark on 2 cores.
    "demo": dict(vocab=256, layers=4, width=64, heads=4, latent_dim=32, index_heads=4,
                 index_dim=16, top_k=32, mlp_width=128, group_size=2, residual_scale=0.3),
    # GPU benchmarks: DeepSeek-like sharing, FP8 MLA rows (656 B), fp8 index keys (132 B).
    "h200-deepseek": dict(vocab=32768, layers=32, width=2048, heads=16, latent_dim=576,
                          rope_dim=64, index_heads=16, index_dim=128, top_k=2048,
                          mlp_width=8192, topology="deepseek", group_size=4,
                          row_format="fp8_mla", index_format="fp8", dtype="bfloat16",
                          device="cuda", residual_scale=0.3),
}
