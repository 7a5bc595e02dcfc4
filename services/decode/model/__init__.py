"""Reference DSA-style model (DESIGN.md §7): config, byte codecs, KV access, forward."""

from __future__ import annotations

from services.decode.model.codec import decode_keys, decode_rows, encode_keys, encode_rows
from services.decode.model.config import ModelConfig, preset
from services.decode.model.index_state import IndexState
from services.decode.model.kv import DenseKV, KVAccess
from services.decode.model.model import DSAModel, Prefix

__all__ = ["DSAModel", "DenseKV", "IndexState", "KVAccess", "ModelConfig", "Prefix",
           "decode_keys", "decode_rows", "encode_keys", "encode_rows", "preset"]
