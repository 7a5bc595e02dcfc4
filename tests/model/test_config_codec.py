"""ModelConfig validation, presets, byte codecs and seeded weights."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import InvalidArgument
from services.decode.model import (
    DSAModel,
    ModelConfig,
    decode_keys,
    decode_rows,
    encode_keys,
    encode_rows,
    preset,
)
from services.decode.model.weights import init_weights


@pytest.mark.parametrize(("changes", "needle"), [
    ({"top_k": 0}, "top_k=0"),
    ({"topology": "mesh"}, "topology='mesh'"),
    ({"layers": 5, "group_size": 2}, "layers=5"),
    ({"dtype": "float16"}, "dtype='float16'"),
    ({"row_format": "fp8_mla", "latent_dim": 100, "rope_dim": 4}, "latent_dim - rope_dim=96"),
    ({"rope_dim": 4}, "rope_dim=4"),
    ({"vocab": True}, "vocab=True"),
])
def test_config_rejects_bad_fields_naming_them(changes, needle):
    with pytest.raises(InvalidArgument, match=needle.replace("(", r"\(")):
        ModelConfig(**changes)


def test_presets_and_derived_geometry():
    tiny = preset("tiny")
    assert (tiny.vocab, tiny.layers, tiny.width, tiny.top_k) == (64, 4, 32, 8)
    assert tiny.row_bytes == 16 * 4 and tiny.index_key_bytes == 8 * 4
    assert preset("tiny", dtype="bfloat16").row_bytes == 16 * 2
    h200 = preset("h200-deepseek")
    assert (h200.row_bytes, h200.index_key_bytes, h200.top_k) == (656, 132, 2048)
    assert h200.topology == "deepseek" and h200.layers >= 10 and h200.payloads_per_group == 1
    assert preset("demo").layers >= tiny.layers
    with pytest.raises(InvalidArgument, match="preset='huge'"):
        preset("huge")


def test_topology_maps_layers_to_payload_sources():
    glm = preset("tiny", layers=6, group_size=3)
    assert [glm.payload_of(layer) for layer in range(6)] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    ds = preset("tiny", layers=6, group_size=3, topology="deepseek")
    assert [ds.payload_of(layer) for layer in range(6)] == [(0, 0)] * 3 + [(1, 0)] * 3
    assert [ds.produces_payload(layer) for layer in range(6)] == [1, 0, 0, 1, 0, 0]


def test_raw_rows_round_trip_bit_exact():
    cfg = preset("tiny")
    x = torch.randn(5, 3, cfg.latent_dim)
    rows = encode_rows(cfg, x)
    assert rows.dtype == torch.uint8 and rows.shape == (5, 3, cfg.row_bytes)
    assert torch.equal(decode_rows(cfg, rows), x)
    k = torch.randn(7, cfg.index_dim)
    assert torch.equal(decode_keys(cfg, encode_keys(cfg, k)), k)


def test_fp8_mla_layout_is_656_bytes_and_decodes_close():
    cfg = ModelConfig(latent_dim=576, rope_dim=64, row_format="fp8_mla", index_dim=128,
                      index_format="fp8")
    x = torch.randn(9, 576)
    rows = encode_rows(cfg, x)
    assert rows.shape == (9, 656)
    y = decode_rows(cfg, rows)
    assert torch.equal(y[:, 512:], x[:, 512:].bfloat16().float())  # rope kept as bf16
    assert (y[:, :512] - x[:, :512]).abs().max() <= 0.07 * x[:, :512].abs().max()
    keys = encode_keys(cfg, torch.randn(4, 128))
    assert keys.shape == (4, 132)


def test_weights_deterministic_from_seed():
    a, b = init_weights(preset("tiny", seed=3)), init_weights(preset("tiny", seed=3))
    c = init_weights(preset("tiny", seed=4))
    assert torch.equal(a.layers[2].wq, b.layers[2].wq) and torch.equal(a.lm_head, b.lm_head)
    assert not torch.equal(a.layers[2].wq, c.layers[2].wq)
    toks = torch.arange(10) % 64
    pa = DSAModel(preset("tiny", seed=3)).prefill(toks)
    pb = DSAModel(preset("tiny", seed=3)).prefill(toks)
    assert torch.equal(pa.next_logits, pb.next_logits)
    assert not torch.equal(pa.next_logits, DSAModel(preset("tiny", seed=4)).prefill(toks)
                           .next_logits)
