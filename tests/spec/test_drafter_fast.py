"""The vectorized drafter feed (``fast_draft.feed_batched``) against the per-position
reference: logits and ring state up to rounding on random rings (multi-position chunks,
several slots, partial windows, after rollback), identical greedy proposals, identical
engine streams; the batch-invariant mode keeps the reference."""

from __future__ import annotations

import time

import pytest
import torch

from services.decode.engine.engine import Engine
from services.decode.engine.request import GenerateSpec
from services.decode.model import DSAModel, preset
from services.decode.spec import drafter as drafter_mod
from services.decode.spec.drafter import Drafter, DrafterConfig
from tests.engine.harness import outputs, pressured, prompts

TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def model() -> DSAModel:
    return DSAModel(preset("tiny", batch_invariant=False))


def _pair(model, slots=4, **kw) -> tuple[Drafter, Drafter]:
    cfg = {"layers": 2, "window": 6, "page": 4, "k_max": 4, **kw}
    return (Drafter(model, DrafterConfig(**cfg), slots),
            Drafter(model, DrafterConfig(**cfg), slots, vectorized=False))


def _copy_state(src: Drafter, dst: Drafter) -> None:
    for a, b in zip(src.rings, dst.rings, strict=True):
        b.storage.copy_(a.storage)
        b._frontier[:], b._high[:], b._base[:] = a._frontier, a._high, a._base


def _assert_same_state(a: Drafter, b: Drafter) -> None:
    for ra, rb in zip(a.rings, b.rings, strict=True):
        assert all(ra.pointer_state(s) == rb.pointer_state(s) for s in range(ra.slots))
        torch.testing.assert_close(ra.storage, rb.storage, **TOL)


def _randomize(d: Drafter, g: torch.Generator) -> None:
    """Random ring rows; per slot a random base, a random amount written, and a random
    rollback (so high > frontier, windows partially filled near the base)."""
    D = d.rings[0].storage.shape[-1]
    for s in range(d.rings[0].slots):
        base = int(torch.randint(0, 40, (1,), generator=g))
        n = int(torch.randint(1, d.chunk + 1, (1,), generator=g))
        back = int(torch.randint(0, min(n, d.cfg.k_max) + 1, (1,), generator=g))
        for r in d.rings:
            r.storage.copy_(torch.randn(r.storage.shape, generator=g))
            r.reset(s, base)
            r.write(s, base, torch.randn(n, D, generator=g))
            r.rollback(s, base + n - back)


def _items(d: Drafter, slots, g: torch.Generator, max_len: int):
    items = []
    for s in slots:
        f, _, base = d.rings[0].pointer_state(s)
        start = max(base, f - int(torch.randint(0, 3, (1,), generator=g)))
        c = int(torch.randint(1, max_len + 1, (1,), generator=g))
        items.append((s, start, torch.randint(0, 64, (c,), generator=g)))
    return items


@pytest.mark.parametrize("seed", range(6))
def test_feed_matches_reference_on_random_rings(model, seed):
    fast, ref = _pair(model, slots=5)
    g = torch.Generator().manual_seed(seed)
    _randomize(ref, g)
    for step in range(3):  # successive feeds: state carried over, fast state re-synced
        _copy_state(ref, fast)
        slots = torch.randperm(5, generator=g)[: 1 + step + seed % 3].tolist()
        items = _items(ref, slots, g, max_len=ref.chunk if step == 0 else 3)
        lf, lr = fast._feed(items), ref._feed(items)
        assert lf.shape == (len(items), model.cfg.vocab)
        torch.testing.assert_close(lf, lr, **TOL)
        _assert_same_state(fast, ref)


def test_feed_same_slot_twice_matches_reference(model):
    fast, ref = _pair(model)
    g = torch.Generator().manual_seed(11)
    _randomize(ref, g)
    _copy_state(ref, fast)
    f = ref.frontier(2)
    items = [(2, f, torch.tensor([3, 4, 5])), (1, ref.frontier(1), torch.tensor([7])),
             (2, f + 1, torch.tensor([9, 10]))]  # rewrites positions f+1, f+2
    torch.testing.assert_close(fast._feed(items), ref._feed(items), **TOL)
    _assert_same_state(fast, ref)


def _hist(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(seed))


def _min_margin(probs: torch.Tensor, nq: torch.Tensor) -> float:
    top2 = probs.topk(2, dim=-1).values
    gap = top2[..., 0] - top2[..., 1]  # [B, K−1]
    used = torch.arange(probs.shape[1])[None, :] < (nq[:, None] - 1)
    return float(gap[used].min())


@pytest.mark.parametrize("mode", ["fixed", "confidence"])
def test_proposals_identical_to_reference(model, mode):
    fast, ref = _pair(model, slots=4, mode=mode, threshold=0.09)
    hists = [_hist(n, seed=n) for n in (5, 31, 1, 17)]
    margins, lengths = [], set()
    for rnd in range(4):  # rounds with a rollback in between, as the engine does
        pf, pr = fast.propose([2, 0, 3, 1], hists), ref.propose([2, 0, 3, 1], hists)
        margins.append(_min_margin(pr.probs, pr.num_queries))
        assert torch.equal(pf.tokens, pr.tokens), rnd
        assert torch.equal(pf.num_queries, pr.num_queries), rnd
        lengths.update(pr.num_queries.tolist())
        torch.testing.assert_close(pf.probs, pr.probs, **TOL)
        nxt = []
        for b, (slot, h) in enumerate(zip([2, 0, 3, 1], hists, strict=True)):
            keep = 1 + (b + rnd) % int(pr.num_queries[b])  # anchor + some proposals
            new = torch.cat([h, pr.tokens[b, 1:keep], torch.tensor([(7 * b + rnd) % 64])])
            for d in (fast, ref):
                d.rollback(slot, h.shape[0] + keep - 1)
            nxt.append(new)
        hists = nxt
    assert min(margins) > 1e-4  # the greedy choices are not decided by rounding (~1e-7)
    assert len(lengths) > 1 if mode == "confidence" else lengths == {4}


def test_catch_up_from_far_behind_matches_reference(model):
    fast, ref = _pair(model, slots=3)
    hists = [_hist(80, seed=1), _hist(3, seed=2), _hist(40, seed=3)]
    torch.testing.assert_close(fast._catch_up([0, 1, 2], hists),
                               ref._catch_up([0, 1, 2], hists), **TOL)
    _assert_same_state(fast, ref)
    assert fast.rings[0].pointer_state(0)[2] == 79 - 2 * 5


def test_batch_invariant_mode_keeps_the_reference(monkeypatch):
    inv = DSAModel(preset("tiny", batch_invariant=True))

    def boom(*a, **k):
        raise AssertionError("vectorized feed used in batch-invariant mode")

    monkeypatch.setattr(drafter_mod, "feed_batched", boom)
    d = Drafter(inv, DrafterConfig(layers=2, window=6, page=4, k_max=4), 2)
    d.propose([0, 1], [_hist(9, 1), _hist(20, 2)])  # no AssertionError


def _engine_stream(vectorized: bool):
    engine = Engine(pressured("adaptive-spec", "glm", pages=400, batch_invariant=False))
    engine.drafter.vectorized = vectorized
    for i, prompt in enumerate(prompts(6, seed=3)):
        engine.submit(GenerateSpec(f"r{i}", 20, prompt=prompt))
    while not engine.idle:
        engine.step()
    return outputs(engine), engine.stats.rounds


def test_engine_streams_identical_with_reference_drafter():
    fast, fast_rounds = _engine_stream(True)
    ref, ref_rounds = _engine_stream(False)
    assert len(fast) == 6 and all(len(v) == 20 for v in fast.values())
    assert fast == ref
    assert fast_rounds == ref_rounds  # same proposals, hence same acceptance


def test_timing_sanity(model, capsys):
    """Not an assertion on speed: prints the catch-up + propose time of both paths."""
    fast, ref = _pair(model, slots=8, layers=2, window=16, page=16)
    hists = [_hist(200 + 7 * i, seed=i) for i in range(8)]
    times = {}
    for name, d in (("fast", fast), ("reference", ref)):
        t0 = time.perf_counter()
        for r in range(3):
            d.propose(range(8), [h[: h.shape[0] - 3 + r] for h in hists])
            for s, h in enumerate(hists):
                d.rollback(s, h.shape[0] - 3 + r)
        times[name] = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\ndrafter 3 rounds x 8 requests: fast {times['fast'] * 1e3:.1f} ms, "
              f"reference {times['reference'] * 1e3:.1f} ms")
