"""The vectorized forward (services/decode/model/fast.py) against the reference forward."""

from __future__ import annotations

import pytest
import torch

from services.decode.model import DenseKV, DSAModel, decode_keys, decode_rows, preset
from services.decode.model.fast import (
    DenseIndexState,
    FastDSAModel,
    select_topk_batched,
    synthetic_prefix,
)
from services.decode.model.ops import select_topk

CONFIGS = {
    "glm": dict(topology="glm"),
    "deepseek": dict(topology="deepseek"),
    "deepseek-fp8": dict(topology="deepseek", group_size=4, latent_dim=136, rope_dim=8,
                         row_format="fp8_mla", index_format="fp8"),
}
MAXPOS = 64


class _SpyKV(DenseKV):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.selections: list[torch.Tensor] = []

    def resolve(self, group, slots, selections, bounds):
        self.selections.append(selections.clone())
        return super().resolve(group, slots, selections, bounds)


def _pair(name: str, **kw):
    cfg = preset("tiny", **{**CONFIGS[name], "top_k": 6, **kw})
    ref = DSAModel(cfg)
    return ref, FastDSAModel(cfg, ref.w, slots=4, max_positions=MAXPOS)


def _setup(model, prefixes, slots):
    cfg = model.cfg
    kv = _SpyKV(cfg.groups, cfg.payloads_per_group, cfg.row_bytes, 4, MAXPOS)
    index = model.new_index_state()
    for s, p in zip(slots, prefixes, strict=True):
        model.import_prefix(p, s, index, kv)
    return kv, index


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fast_round_matches_reference(name: str) -> None:
    """A mixed round (prefix lengths 1..29, K_b = 1..4, padding, a query at t < k):
    logits allclose, written rows/keys identical, selections identical where the
    reference's scores are separated (random fp32 scores: always, for these seeds)."""
    ref, fast = _pair(name)
    gen = torch.Generator().manual_seed(11)
    lens = [29, 3, 17, 1]
    prefixes = [ref.prefill(torch.randint(0, 64, (n,), generator=gen), chunk=8) for n in lens]
    slots = torch.tensor([2, 0, 3, 1])
    tokens = torch.randint(0, 64, (4, 4), generator=gen)
    n, nq = torch.tensor(lens), torch.tensor([4, 1, 3, 2])
    out = {}
    for label, model in (("ref", ref), ("fast", fast)):
        kv, index = _setup(model, prefixes, slots.tolist())
        logits = model.forward(tokens, n, nq, slots, kv, index)
        out[label] = (logits, kv, index)
    (lr, kr, ir), (lf, kf, i_f) = out["ref"], out["fast"]
    assert isinstance(i_f, DenseIndexState)
    assert torch.allclose(lr, lf, atol=1e-4, rtol=1e-4), (lr - lf).abs().max()
    assert torch.equal(lf[1, 1:], torch.zeros_like(lf[1, 1:]))  # padding queries
    for a, b in zip(kr.selections, kf.selections, strict=True):
        assert torch.equal(a, b)
    cfg = ref.cfg
    for s, length in zip(slots.tolist(), lens, strict=True):
        stop = length + int(nq[slots.tolist().index(s)])
        rows_r, rows_f = kr.export_rows(s, stop), kf.export_rows(s, stop)
        # group 0 reads only the embedding: identical bytes; later groups within rounding
        assert torch.equal(ir.keys(s, 0, stop), i_f.keys(s, 0, stop))
        assert torch.equal(rows_r[(0, 0)], rows_f[(0, 0)])
        for g in range(1, cfg.groups):
            a, b = decode_keys(cfg, ir.keys(s, g, stop)), decode_keys(cfg, i_f.keys(s, g, stop))
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-3)
        for key in rows_r:
            a, b = decode_rows(cfg, rows_r[key]), decode_rows(cfg, rows_f[key])
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-3)


def test_fast_prefill_matches_reference_prefill() -> None:
    ref, fast = _pair("deepseek-fp8")
    toks = torch.randint(0, 64, (37,), generator=torch.Generator().manual_seed(3))
    a, b = ref.prefill(toks, chunk=8), fast.prefill(toks, chunk=8)
    assert torch.allclose(a.next_logits, b.next_logits, atol=1e-4, rtol=1e-4)
    assert all(torch.equal(x, y) for x, y in zip(a.keys, b.keys, strict=True))


@pytest.mark.parametrize("T,k", [(1, 4), (5, 8), (40, 8), (431, 123)])
def test_batched_topk_is_the_reference_tie_rule(T: int, k: int) -> None:
    gen = torch.Generator().manual_seed(T)
    scores = torch.randint(0, 7, (3, 2, T), generator=gen).float()  # many ties
    bounds = torch.tensor([[T, max(T - 1, 0)], [0, 1], [T // 2, T]])
    masked = scores.masked_fill(torch.arange(T) >= bounds.unsqueeze(-1), float("-inf"))
    got = select_topk_batched(masked, k)
    for b in range(3):
        for j in range(2):
            t = int(bounds[b, j])
            want = select_topk(scores[b, j, :t], k) if t else torch.empty(0, dtype=torch.int64)
            assert got[b, j, : want.numel()].tolist() == want.tolist()
            assert bool((got[b, j, want.numel():] == -1).all())


def test_dense_index_state_contract() -> None:
    st = DenseIndexState(groups=2, key_bytes=3, slots=2, max_positions=8)
    st.open(1)
    st.write(1, 0, 0, torch.full((5, 3), 7, dtype=torch.uint8))
    assert st.length(1, 0) == 5 and st.keys(1, 0, 5).sum() == 7 * 15
    st.truncate(1, 2)
    assert st.length(1, 0) == 2 and st.nbytes(1) == 6
    with pytest.raises(Exception, match="gap"):
        st.write(1, 0, 4, torch.zeros(1, 3, dtype=torch.uint8))
    with pytest.raises(Exception, match="max_positions"):
        st.write(1, 0, 2, torch.zeros(7, 3, dtype=torch.uint8))
    st.close(1)
    with pytest.raises(Exception, match="open it first"):
        st.length(1)


def test_synthetic_prefix_has_valid_layouts() -> None:
    cfg = preset("tiny", **CONFIGS["deepseek-fp8"])
    p = synthetic_prefix(cfg, torch.arange(50), seed=4)
    assert p.length == 50 and p.rows[(0, 0)].shape == (50, cfg.row_bytes)
    assert p.keys[0].shape == (50, cfg.index_key_bytes)
    assert torch.isfinite(decode_rows(cfg, p.rows[(0, 0)]).float()).all()
    assert torch.isfinite(decode_keys(cfg, p.keys[0]).float()).all()
