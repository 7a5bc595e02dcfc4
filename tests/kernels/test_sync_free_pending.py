"""The sync-free path's pending slots (resolver_common.cuh R_PEND): every lookup block adds
its misses, staged rows and status to the slots of the call's parity, and a commit that
finds them all 0 leaves the batch sums to its last block. One workspace serves round after
round, with and without misses, with stray lookups (no commit) leaving slots dirty between
them; a twin group resolved by plain launches (fresh workspace, the lookup's own sums) must
end every round identical: locations, totals, copy list, hot-cache state and bytes."""

from __future__ import annotations

import random

import pytest
import torch

from tests.hierarchy.harness import assert_same, snapshot
from tests.kernels.test_fused_resolver import make_pair, selections

# batch, K, k, hot slots, staging rows, row bytes: a warp-summed batch (<= 32) and one above
# the SM count (block-summed, 512-thread lookup blocks)
CASES = [(5, 2, 24, 32, 512, 16), (160, 1, 16, 16, 4096, 12)]
ROUNDS = (0.0, 1.0, 1.0, 0.5, 1.0, 1.0, 0.0, 1.0)  # hit fractions (1.0: every row held)


def _round(h, ws, rids, sel, host_totals: bool, *, commit: bool = True) -> tuple:
    from kernels import dropin
    from kernels import resolver as kres

    g, n, (batch, k_queries, k) = h.group, sel.numel(), sel.shape
    if ws is None:
        ws = kres.Workspace.new(batch, k_queries * k, g.hot_slots, g.device)
    table = dropin.request_table(g, [g.request(r) for r in rids])
    host, pay = dropin._copy_pointers(g, rids, range(g.spec.payload_layers))
    stage = torch.tensor(sorted(g.staging.free_locs), dtype=torch.int64, device=g.device)
    out = kres.CopyList(*(torch.full((n,), -5, dtype=torch.int64, device=g.device)
                          for _ in range(4)))
    locs = torch.full_like(sel, -7)
    kres.lookup(ws, table, sel, h.causal_bounds(rids, k_queries), locs, hot_slots=g.hot_slots,
                tail_rows=g.config.tail_rows, page_rows=g.config.page_rows,
                rows_bound=max(g.request(r).tail_lo for r in rids),
                finished_epoch=g.finished_epoch, host_totals=host_totals)
    if not commit:
        return ()
    kres.commit(ws, table, sel, locs, stage, out, epoch=g.clock + 1, hot_slots=g.hot_slots,
                host_ptrs=host, payloads=pay, row_bytes=g.spec.row_bytes, dependent=True)
    torch.cuda.synchronize()
    totals = torch.cat([ws.totals[: kres.R_PEND],
                        ws.totals[kres.TOT_COLS: kres.TOT_COLS + 2 * (batch + 1)]]).cpu()
    p = kres.R_PEND + 3 * ws.parity
    pending = int(ws.totals[p: p + 3].abs().sum())  # the slots this commit read
    return (locs.cpu(), totals, [t.cpu() for t in (out.batch, out.rows, out.dst,
                                                  out.staged_rows)], pending)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}-K{}-k{}-B{}-S{}-R{}".format(*c))
def test_one_workspace_across_rounds_with_and_without_pending_work(case) -> None:
    from kernels import resolver as kres

    batch, k_queries, k, hot, staging, row_bytes = case
    seed = random.randrange(1 << 30)  # printed on failure
    plain, sync_free, rids = make_pair(seed, batch, k_queries, hot, staging, row_bytes)
    gen = torch.Generator().manual_seed(seed)
    g = sync_free.group
    ws = kres.Workspace.new(batch, k_queries * k, g.hot_slots, g.device)
    pending = []
    for rnd, hit_frac in enumerate(ROUNDS):
        sel = selections(plain, rids, k_queries, k, hit_frac, gen)
        want = _round(plain, None, rids, sel, True)
        got = _round(sync_free, ws, rids, sel, False)
        assert torch.equal(want[0], got[0]), (seed, rnd)
        assert torch.equal(want[1], got[1]), (seed, rnd, want[1], got[1])
        for x, y in zip(want[2], got[2], strict=True):
            assert torch.equal(x, y), (seed, rnd)
        assert_same(snapshot(plain), snapshot(sync_free))
        sync_free.check()
        pending.append(got[3])
        if rnd % 3 == 2:  # a stray lookup with misses: its slots stay dirty (no commit)
            stray = selections(plain, rids, k_queries, k, 0.0, gen)
            _round(sync_free, ws, rids, stray, False, commit=False)
            torch.cuda.synchronize()
            assert_same(snapshot(plain), snapshot(sync_free))  # a lookup mutates nothing
    # both ways were taken: commits with nothing pending, and summing ones
    assert 0 in pending and any(pending), pending
