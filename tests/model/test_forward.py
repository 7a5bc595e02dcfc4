"""Forward pass: exactness of speculative rounds, batch invariance, selection, prefixes."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import InvalidArgument
from services.decode.model import DenseKV, DSAModel, Prefix, preset
from services.decode.model.ops import select_topk

CONFIGS = {
    "glm": dict(topology="glm"),
    "deepseek": dict(topology="deepseek"),
    "deepseek-fp8": dict(topology="deepseek", group_size=4, latent_dim=136, rope_dim=8,
                         row_format="fp8_mla", index_format="fp8"),
}
MAXPOS = 40


def _model(name: str, **kw) -> DSAModel:
    return DSAModel(preset("tiny", **{"batch_invariant": True, **CONFIGS[name], **kw}))


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(seed))


def _open(model: DSAModel, prefix: Prefix, slots: int = 4):
    kv, index = DenseKV.for_model(model.cfg, slots, MAXPOS), model.new_index_state()
    for s in range(slots):
        model.import_prefix(prefix, s, index, kv)
    return kv, index


def _i64(*v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int64)


def _sequential(model, prefix, block):
    """K single-query decode steps; returns logits [K, V], rows, keys of slot 0."""
    kv, index = _open(model, prefix, slots=1)
    T, out = prefix.length, []
    for j, tok in enumerate(block.tolist()):
        out.append(model.forward(_i64(tok).view(1, 1), _i64(T + j), _i64(1), _i64(0), kv,
                                 index)[0, 0])
    n = T + len(block)
    return torch.stack(out), kv.export_rows(0, n), index.export(0, n)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_speculative_round_equals_sequential_steps_bit_exact(name):
    model = _model(name)
    prefix = model.prefill(_tokens(13, seed=1), chunk=5)
    block = _tokens(5, seed=2)
    seq_logits, seq_rows, seq_keys = _sequential(model, prefix, block)
    kv, index = _open(model, prefix, slots=1)
    logits = model.forward(block.view(1, -1), _i64(13), _i64(5), _i64(0), kv, index)
    assert torch.equal(logits[0], seq_logits)
    rows = kv.export_rows(0, 18)
    assert all(torch.equal(rows[key], seq_rows[key]) for key in seq_rows)
    assert all(torch.equal(a, b) for a, b in zip(index.export(0, 18), seq_keys, strict=True))


@pytest.mark.parametrize("name", ["glm", "deepseek"])
def test_batch_one_equals_batch_n_with_other_requests(name):
    model = _model(name)
    prefixes = [model.prefill(_tokens(n, seed=n), chunk=64) for n in (13, 3, 21, 9)]
    block = _tokens(4, seed=7)
    kv1, idx1 = _open(model, prefixes[0], slots=1)
    alone = model.forward(block.view(1, -1), _i64(13), _i64(4), _i64(0), kv1, idx1)[0]
    kv, index = DenseKV.for_model(model.cfg, 4, MAXPOS), model.new_index_state()
    for slot, p in zip((2, 0, 3, 1), prefixes, strict=True):
        model.import_prefix(p, slot, index, kv)
    others = torch.stack([_tokens(4, seed=s) for s in (11, 12, 13)])
    tokens = torch.cat([others[:1], block.view(1, -1), others[1:]])
    n, slots = _i64(3, 13, 21, 9), _i64(0, 2, 3, 1)
    batched = model.forward(tokens, n, _i64(2, 4, 1, 3), slots, kv, index)
    assert torch.equal(batched[1], alone)
    assert torch.equal(batched[2, 1:], torch.zeros_like(batched[2, 1:]))  # padding


def test_fast_mode_is_close_to_invariant_mode():
    fast, inv = _model("glm", batch_invariant=False), _model("glm")
    toks = _tokens(20, seed=5)
    a, b = fast.prefill(toks, chunk=20).next_logits, inv.prefill(toks, chunk=20).next_logits
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


class _SpyKV(DenseKV):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def resolve(self, group, slots, selections, bounds):
        self.calls.append((group, selections.clone(), bounds.clone()))
        return super().resolve(group, slots, selections, bounds)


@pytest.mark.parametrize("name", ["glm", "deepseek"])
def test_selection_takes_min_k_visible_below_each_bound(name):
    model = _model(name)
    kv = _SpyKV(model.cfg.groups, model.cfg.payloads_per_group, model.cfg.row_bytes, 1, MAXPOS)
    index = model.new_index_state()
    index.open(0)
    model.forward(_tokens(12, seed=3).view(1, -1), _i64(0), _i64(12), _i64(0), kv, index)
    assert [g for g, _, _ in kv.calls] == list(range(model.cfg.groups))  # one per group
    for _, sel, bounds in kv.calls:
        for j in range(12):
            chosen = sel[0, j][sel[0, j] >= 0]
            assert chosen.numel() == min(model.cfg.top_k, j) and bool((chosen < j).all())
            assert bool((sel[0, j, chosen.numel():] == -1).all())
            assert chosen.unique().numel() == chosen.numel()
            assert int(bounds[0, j]) == j


def test_select_topk_orders_by_score_then_position():
    scores = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0])
    assert select_topk(scores, 2).tolist() == [1, 2]
    assert select_topk(scores, 4).tolist() == [1, 2, 4, 3]
    assert select_topk(scores, 9).tolist() == [1, 2, 4, 3, 0]


def test_prefix_import_into_many_requests_matches_prefill():
    model = _model("glm")
    toks = _tokens(16, seed=9)
    whole = model.prefill(toks)
    head = model.prefill(toks[:10], chunk=3)
    kv, index = _open(model, head, slots=3)
    logits = model.forward(toks[10:].view(1, -1).repeat(3, 1), _i64(10, 10, 10),
                           _i64(6, 6, 6), _i64(0, 1, 2), kv, index)
    for s in range(3):
        assert torch.equal(logits[s, -1], whole.next_logits)
        assert torch.equal(kv.export_rows(s, 16)[(1, 1)], whole.rows[(1, 1)])


def test_rolled_back_rows_and_keys_are_not_visible():
    model = _model("glm")
    prefix = model.prefill(_tokens(10, seed=4))
    kv, index = _open(model, prefix, slots=1)
    model.forward(_tokens(4, seed=5).view(1, -1), _i64(10), _i64(4), _i64(0), kv, index)
    kv.rollback(0, 11)
    index.truncate(0, 11)
    assert index.length(0, 0) == 11
    with pytest.raises(InvalidArgument, match="never written"):
        kv.resolve(0, _i64(0), _i64(12).view(1, 1, 1), _i64(13).view(1, 1))


def test_forward_rejects_bad_input():
    model = _model("glm")
    kv, index = DenseKV.for_model(model.cfg, 1, MAXPOS), model.new_index_state()
    index.open(0)
    tok = torch.zeros(1, 2, dtype=torch.int64)
    with pytest.raises(InvalidArgument, match="num_queries"):
        model.forward(tok, _i64(0), _i64(3), _i64(0), kv, index)
    with pytest.raises(InvalidArgument, match=r"tokens must be in 0\.\.63"):
        model.forward(tok + 64, _i64(0), _i64(2), _i64(0), kv, index)
    with pytest.raises(InvalidArgument, match=r"n_committed.shape=\(2,\)"):
        model.forward(tok, _i64(0, 0), _i64(1), _i64(0), kv, index)
    assert index.length(0, 0) == 0  # nothing changed
