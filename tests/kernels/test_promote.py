"""Staging promotion kernel (kernels/resolver_promote.cu) against the torch promotion of
``services.decode.hierarchy.promotion`` (itself checked against the one-by-one definition):
same hot-slot tables, stamps, payload bytes and arena, bit for bit."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import FailedPrecondition, InvalidArgument
from services.decode import hierarchy as ref
from services.decode.hierarchy.request import RANK_VERSION, reindex_hot
from tests.hierarchy.harness import Harness, assert_same, distinct_hot, snapshot
from tests.hierarchy.test_staging_promotion import _one_by_one, _staged_group


def test_cpu_group_falls_back_to_the_reference() -> None:
    from kernels import dropin

    h = Harness("cpu", hot_slots=4, staging_rows=8)
    h.admit("a", 40, 8)
    g = h.group
    g.clock = g.finished_epoch = 5
    g.staging.acquire("a", [7, 8], 5)
    twin = copy.deepcopy(h)
    assert dropin.release_staging(g) == ref.release_staging(twin.group) == 2
    assert_same(snapshot(h), snapshot(twin))


def test_pending_readers_raise_and_change_nothing() -> None:
    from kernels import dropin

    h = Harness("cpu", hot_slots=4, staging_rows=8)
    h.admit("a", 40, 8)
    h.group.clock = 5
    h.group.staging.acquire("a", [7, 8], 5)  # epoch 5 readers not finished
    before = snapshot(h)
    with pytest.raises(FailedPrecondition, match="still have readers"):
        dropin.release_staging(h.group)
    assert_same(before, snapshot(h))


def test_promote_validates_before_launch() -> None:
    from kernels.promote import promote
    from kernels.resolver import T_COLS

    z = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(InvalidArgument, match="table is on device=cpu"):
        promote(torch.zeros(1, T_COLS, dtype=torch.int64), z, z, torch.zeros(2, dtype=torch.int64),
                z, torch.zeros(1, dtype=torch.int32), z, z, hot_slots=4, rows_bound=8,
                finished_epoch=0, row_bytes=16)


def test_promote_shared_memory_formula_and_the_serving_shape_fits_an_sm() -> None:
    from kernels.promote import promote_shared_bytes

    assert promote_shared_bytes(4096, 100_000) == 8 * 4096 + 8 * 3125 + 4 * 4096
    assert promote_shared_bytes(5000, 1) == 8 * 8192 + 8 + 4 * 5000  # B > 4096: next pow2
    assert promote_shared_bytes(4096, 32_800) < 227 * 1024 - 16 * 1024  # H200 opt-in cap


# -- GPU ------------------------------------------------------------------------------


@pytest.mark.gpu
@settings(max_examples=150, deadline=None)
@given(st.data())
def test_kernel_equals_one_by_one_on_small_groups(data) -> None:
    """Tiny caches, repeated and already-held staged rows (the sequential path)."""
    from kernels import dropin

    h = _staged_group(data, "cuda")
    twin = copy.deepcopy(h.group)
    indexed = all(distinct_hot(s) for s in h.group.requests.values())
    version = {rid: int(s.hot_rank[RANK_VERSION]) for rid, s in h.group.requests.items()}
    assert dropin.release_staging(h.group) == _one_by_one(twin)
    for rid, s in h.group.requests.items():
        r = twin.requests[rid]
        # the rank form's cache goes stale exactly where a row was promoted (the reference
        # bumps once per promoted row, the kernel once per block)
        assert (int(s.hot_rank[RANK_VERSION]) != version[rid]) == (
            int(r.hot_rank[RANK_VERSION]) != version[rid]), rid
        for f in ("hot_rows", "hot_stamp"):
            assert torch.equal(getattr(s, f), getattr(r, f)), (rid, f)
        if indexed:  # the index is defined under I4 only (the drawn hot rows may repeat)
            assert torch.equal(s.hot_index, r.hot_index), rid
    for a, b in zip(h.group.payloads, twin.payloads, strict=True):
        assert torch.equal(a, b)
    assert h.group.staging.free_locs == twin.staging.free_locs


def _big_group(seed: int, hot: int, requests: int, per_block: int, waves: int,
               held_frac: float, row_bytes: int, device: str = "cuda") -> Harness:
    """``requests`` requests with random hot caches (distinct rows, random stamps, some
    past finished_epoch: protected) and ``waves`` staged blocks each of ascending rows,
    some already held."""
    rng = random.Random(seed)
    p = 64
    h = Harness(device, policy="hisparse", row_bytes=row_bytes, seed=seed, page_rows=p,
                tail_rows=p, hot_slots=hot, reserve_pages=0,
                staging_rows=2 * requests * per_block * waves,
                num_pages=requests * (-(-hot // p) + 4), max_requests=requests)
    g = h.group
    epoch = 40
    rids = [f"r{i}" for i in range(requests)]
    universe = 2 * hot + 1000  # committed rows (I4: hot rows are), well over B
    for rid in rids:
        h.admit(rid, universe, universe)
    g.clock, g.finished_epoch = epoch + 2, epoch  # stamps past epoch: protected slots
    for rid in rids:
        s = g.request(rid)
        rows = rng.sample(range(universe), hot)
        s.hot_rows[:] = torch.tensor([r if rng.random() < 0.9 else -1 for r in rows])
        s.hot_stamp[:] = torch.tensor([rng.choice([0, rng.randrange(epoch)])
                                       if rng.random() >= 0.05 else epoch + 1 + rng.randrange(2)
                                       for _ in rows])
        reindex_hot(s)
    for w in range(waves):
        for rid in rids:
            held = [r for r in g.request(rid).hot_rows.tolist() if r >= 0]
            n = rng.randrange(1, per_block + 1)
            pick = set(rng.sample(range(universe), n))
            if held_frac:
                pick |= set(rng.sample(held, int(held_frac * n)))
            locs = g.staging.acquire(rid, sorted(pick), epoch - waves + 1 + w)
            for payload in g.payloads:
                payload[locs] = h.random_rows(len(locs)).to(payload.device)
    return h


@pytest.mark.gpu
@pytest.mark.parametrize("hot,requests,per_block,waves,held_frac,row_bytes", [
    (4096, 32, 3000, 1, 0.0, 656),    # the serving shape: fast path, register sort
    (4096, 8, 5000, 2, 0.0, 1152),    # more rows than eligible slots, two waves
    (1000, 5, 700, 2, 0.05, 20),      # padded sort, held rows: sequential path
    (5000, 3, 2000, 1, 0.0, 16),      # B > 4096: shared-memory sort
    (6000, 2, 4000, 3, 0.02, 100),    # both
])
def test_kernel_equals_torch_promotion_at_scale(hot, requests, per_block, waves, held_frac,
                                                row_bytes) -> None:
    from kernels import dropin

    seed = random.randrange(1 << 30)  # fresh inputs every run; printed on failure
    h = _big_group(seed, hot, requests, per_block, waves, held_frac, row_bytes)
    twin = copy.deepcopy(h)
    got = dropin.release_staging_async(h.group)
    want = ref.release_staging(twin.group)
    assert int(got) == want > 0, seed
    assert_same(snapshot(twin), snapshot(h))
