"""The drafter: determinism, batch invariance, exact rollback/catch-up, schedules, and an
end-to-end greedy speculative loop that reproduces plain greedy decoding."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import InvalidArgument
from services.decode.model import DenseKV, DSAModel, preset
from services.decode.spec.acceptance import greedy_accept
from services.decode.spec.commit import commit_round
from services.decode.spec.drafter import Drafter, DrafterConfig


@pytest.fixture(scope="module")
def model() -> DSAModel:
    return DSAModel(preset("tiny", batch_invariant=True))


def _hist(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(seed))


def _drafter(model, slots=4, **kw) -> Drafter:
    return Drafter(model, DrafterConfig(**{"layers": 2, "window": 6, "page": 4, "k_max": 4,
                                           **kw}), slots)


def _same(a, b) -> bool:
    return (torch.equal(a.tokens, b.tokens) and torch.equal(a.num_queries, b.num_queries)
            and torch.equal(a.probs, b.probs))


def test_batch_proposals_equal_single_request_proposals(model):
    hists = [_hist(n, seed=n) for n in (5, 31, 1)]
    batch = _drafter(model).propose([2, 0, 3], hists)
    assert batch.num_queries.tolist() == [4, 4, 4]
    for b, (slot, h) in enumerate(zip([1, 2, 0], hists, strict=True)):
        alone = _drafter(model).propose([slot], [h])
        assert torch.equal(alone.tokens[0], batch.tokens[b])
        assert torch.equal(alone.probs[0], batch.probs[b])
    assert _same(batch, _drafter(model).propose([2, 0, 3], hists))  # deterministic


def test_rollback_then_continue_equals_fresh_drafter(model):
    d = _drafter(model)
    h = _hist(9, seed=1)
    p = d.propose([0], [h])
    ring_bytes = d.nbytes
    # Accept one proposal, correct the next: committed = h + [x_1], new anchor = 17.
    d.rollback(0, 10)
    assert d.frontier(0) == 10
    h2 = torch.cat([h, p.tokens[0, 1:2], torch.tensor([17])])
    assert _same(d.propose([0], [h2]), _drafter(model).propose([0], [h2]))
    assert d.nbytes == ring_bytes


def test_catch_up_from_far_behind_equals_incremental_feeding(model):
    full = _hist(60, seed=2)
    step = _drafter(model)
    for n in range(5, 60, 5):  # incremental: never more than a window behind
        step.propose([1], [full[:n]])
        step.rollback(1, n - 1)
    jumped = _drafter(model)  # restarts near the anchor: 2 layers · (W − 1) = 10 back
    assert _same(step.propose([1], [full]), jumped.propose([1], [full]))
    assert jumped.rings[0].pointer_state(1)[2] == 59 - 10


def test_confidence_schedule_varies_k_and_respects_threshold(model):
    hists = [_hist(n, seed=n) for n in (3, 8, 13, 21, 34)]
    assert _drafter(model, slots=5, mode="confidence", threshold=0.0).propose(
        range(5), hists).num_queries.tolist() == [4] * 5
    assert _drafter(model, slots=5, mode="confidence", threshold=1.0).propose(
        range(5), hists).num_queries.tolist() == [1] * 5
    fixed = _drafter(model, slots=5).propose(range(5), hists)
    conf = fixed.probs.amax(-1)  # [5, 3]: draft confidence of each proposal
    thr = float(conf.flatten().median())
    p = _drafter(model, slots=5, mode="confidence", threshold=thr).propose(range(5), hists)
    expected = [1 + int((c >= thr).to(torch.int64).cumprod(0).sum()) for c in conf]
    assert p.num_queries.tolist() == expected and len(set(expected)) > 1
    capped = _drafter(model, slots=5).propose(range(5), hists, max_queries=[1, 2, 3, 4, 2])
    assert capped.num_queries.tolist() == [1, 2, 3, 4, 2]
    assert bool((capped.probs[0] == 0).all())  # padding proposals carry no distribution


def test_sampled_proposals_are_seeded(model):
    hists = [_hist(7, seed=3), _hist(12, seed=4)]

    def run(seed):
        gens = [torch.Generator().manual_seed(seed + i) for i in range(2)]
        return _drafter(model, greedy=False).propose([0, 1], hists, generators=gens)

    a, b = run(0), run(0)
    assert _same(a, b) and not torch.equal(a.tokens, run(100).tokens)
    assert torch.allclose(a.probs.sum(-1), torch.ones(2, 3))
    picked = a.probs.gather(2, a.tokens[:, 1:].unsqueeze(-1))
    assert bool((picked > 0).all())


def test_drafter_rejects_bad_input(model):
    with pytest.raises(InvalidArgument, match="max_queries"):
        _drafter(model).propose([0], [_hist(3, 0)], max_queries=[5])
    with pytest.raises(InvalidArgument, match="generators"):
        _drafter(model, greedy=False).propose([0], [_hist(3, 0)])
    with pytest.raises(InvalidArgument, match="layers=5 must be <= target layers=4"):
        _drafter(model, layers=5)
    with pytest.raises(InvalidArgument, match="mode='tree'"):
        DrafterConfig(mode="tree")
    d = _drafter(model)
    d.propose([0], [_hist(9, 0)])
    with pytest.raises(InvalidArgument, match="behind the drafter frontier"):
        d.propose([0], [_hist(5, 0)])


def _greedy_stream(model, prompt, out_len, k_max):
    """Greedy decoding with speculation (k_max > 1) or without; returns (tokens, rounds)."""
    prefix = model.prefill(prompt)
    T = prefix.length
    kv, index = DenseKV.for_model(model.cfg, 1, T + out_len + k_max + 1), model.new_index_state()
    model.import_prefix(prefix, 0, index, kv)
    drafter = Drafter(model, DrafterConfig(layers=1, window=8, page=4, k_max=k_max), 1)
    hist, n, out, rounds = [*prompt.tolist(), int(prefix.next_logits.argmax())], T, [], 0
    while len(out) < out_len:
        p = drafter.propose([0], [torch.tensor(hist)])
        logits = model.forward(p.tokens, torch.tensor([n]), p.num_queries, torch.tensor([0]),
                               kv, index)
        v = greedy_accept(p.tokens, p.num_queries, logits, k_max)
        c = commit_round(n, p.tokens[0, : int(p.num_queries[0])].tolist(),
                         int(v.accepted[0]), int(v.bonus[0]), k_max)
        kv.rollback(0, c.n_committed)
        index.truncate(0, c.n_committed)
        drafter.rollback(0, c.n_committed)
        hist, n = hist[:n] + c.committed_prefix + [c.new_output[-1]], c.n_committed
        out += c.new_output
        rounds += 1
    return [hist[T], *out[:out_len - 1]], rounds


def test_greedy_speculative_decoding_reproduces_plain_decoding(model):
    prompt = _hist(20, seed=8)
    plain, plain_rounds = _greedy_stream(model, prompt, 30, k_max=1)
    spec, spec_rounds = _greedy_stream(model, prompt, 30, k_max=4)
    assert spec == plain
    assert plain_rounds == 30 and spec_rounds < plain_rounds  # > 1 token per round
