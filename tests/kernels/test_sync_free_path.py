"""The sync-free path: lookup, then the commit with the miss copies of every layer, back to
back on the stream with no host read between, the commit summing the batch itself
(``lookup(host_totals=False)``) and launched with PDL. Checked against plain launches with
the lookup's own sums on a twin group: same locations, totals (offsets, status, counts), copy
list, hot-cache state and bytes.

Its pending slots (resolver_common.cuh R_PEND): every lookup block adds its misses and
status to the slots of the call's parity, and a commit that finds both 0 leaves the batch
sums to its last block; one workspace serves round after round (misses, none, bad input),
with stray lookups (no commit) leaving slots dirty between them, under either lookup
shape."""

from __future__ import annotations

import random

import pytest
import torch

from tests.hierarchy.harness import Harness, assert_same, snapshot
from tests.kernels.test_fused_resolver import CASES, commit_kernels, make_pair, selections


def sync_free_round(h: Harness, ws, rids: list[str], sel: torch.Tensor, host_totals: bool,
                    *, commit: bool = True, between=None) -> dict:
    """One round of the two launches on ``h`` (a fresh workspace when ``ws`` is None):
    ``host_totals`` picks the lookup's own sums (plain) or the commit's (sync-free);
    ``between(ws)`` runs between the launches. Returns, after a commit, what both ways must
    agree on plus the values of the pending slots that commit read (nothing without one)."""
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
    vis = h.causal_bounds(rids, k_queries)
    torch.cuda.synchronize()
    kres.lookup(ws, table, sel, vis, locs, hot_slots=g.hot_slots,
                tail_rows=g.config.tail_rows, page_rows=g.config.page_rows,
                rows_bound=max(g.request(r).tail_lo for r in rids),
                finished_epoch=g.finished_epoch, host_totals=host_totals)
    assert ws.commit_sums is not host_totals
    if between is not None:
        between(ws)
    if not commit:
        torch.cuda.synchronize()
        return {}
    kres.commit(ws, table, sel, locs, stage, out, epoch=g.clock + 1, hot_slots=g.hot_slots,
                host_ptrs=host, payloads=pay, row_bytes=g.spec.row_bytes, dependent=True)
    g.clock += 1  # the epoch the round opened, as the drop-in's resolve (I4: stamps <= clock)
    torch.cuda.synchronize()
    p = kres.R_PEND + 2 * ws.parity
    return {
        "locs": locs.cpu(),
        # the pending slots are the sync-free path's own
        "totals": torch.cat([ws.totals[: kres.R_PEND],
                             ws.totals[kres.TOT_COLS: kres.TOT_COLS + 2 * (batch + 1)]]).cpu(),
        "copies": [t.cpu() for t in (out.batch, out.rows, out.dst, out.staged_rows)],
        "pending": int(ws.totals[p: p + 2].abs().sum()),
        "preloads": int(ws.totals[kres.R_PRELOADS]),  # over every call of ws
    }


def assert_rounds_agree(want: dict, got: dict, *context) -> None:
    assert torch.equal(want["locs"], got["locs"]), context
    assert torch.equal(want["totals"], got["totals"]), (*context, want["totals"], got["totals"])
    for x, y in zip(want["copies"], got["copies"], strict=True):
        assert torch.equal(x, y), context


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}-K{}-k{}-B{}-S{}-R{}".format(*c))
def test_sync_free_path_with_dependent_commit_matches_plain_launches(case, monkeypatch) -> None:
    """The commit launched with PDL or plainly, the batch summed by the lookup's last block or
    by the commit launch, every way alike (a staging overflow included)."""
    from kernels import resolver as kres

    batch, k_queries, k, hot, staging, row_bytes = case
    seed = random.randrange(1 << 30)
    pairs = [make_pair(seed, batch, k_queries, hot, staging, row_bytes) for _ in range(2)]
    pairs.append(make_pair(seed, batch, k_queries, hot, staging, row_bytes))
    # harness, DHISPARSE_PDL, host_totals, DHISPARSE_COPY_EARLY (the sync-free commit's copy
    # blocks read host rows before the lookup ends, or after it)
    sides = [(pairs[0][0], "0", True, "1"), (pairs[0][1], "1", True, "1"),
             (pairs[1][0], "1", False, "1"), (pairs[1][1], "0", False, "1"),
             (pairs[2][0], "1", False, "0"), (pairs[2][1], "0", False, "0")]
    rids = pairs[0][2]
    gen = torch.Generator().manual_seed(seed)
    launched, dependent = [], []
    real = kres.launch_dependent
    monkeypatch.setattr(kres, "launch_dependent", lambda *a: dependent.append(real(*a)))
    for hit_frac in (0.0, 0.8, 1.0, 0.3):
        sel = selections(sides[0][0], rids, k_queries, k, hit_frac, gen)
        outs = []
        for h, pdl, host_totals, early in sides:
            monkeypatch.setenv("DHISPARSE_PDL", pdl)
            monkeypatch.setenv("DHISPARSE_COPY_EARLY", early)
            outs.append((sync_free_round(h, None, rids, sel, host_totals), snapshot(h)))
        for other in outs[1:]:
            assert_rounds_agree(outs[0][0], other[0], seed, hit_frac)
            assert_same(outs[0][1], other[1])
        launched.append(int(outs[0][0]["totals"][kres.R_COPIES]))
        # copy blocks preloaded exactly where the sync-free path had copies with it on
        for (_, _, host_totals, early), (got, _) in zip(sides, outs, strict=True):
            want = not host_totals and early == "1" and launched[-1] > 0
            assert (got["preloads"] > 0) == want, (seed, hit_frac, host_totals, early, got)
    assert any(launched)  # copies ran
    # DHISPARSE_PDL=0 plain, =1 by cuLaunchKernelEx
    assert dependent == [False, True, True, False, True, False] * 4


@pytest.mark.gpu
def test_a_commit_finding_no_counts_of_its_call_copies_without_the_preload() -> None:
    """The copy blocks' preload waits for miss counts tagged with the commit's call; a commit
    whose tag no lookup published (here the workspace's tag moved on between the launches)
    gives up after its bound (resolver_commit.cu PRELOAD_WAIT_NS) and copies after the
    lookup all the same."""
    from kernels import resolver as kres

    batch, k_queries, k, hot, staging, row_bytes = PENDING_CASES[0]
    seed = random.randrange(1 << 30)  # printed on failure
    plain, sync_free, rids = make_pair(seed, batch, k_queries, hot, staging, row_bytes)
    gen = torch.Generator().manual_seed(seed)
    g = sync_free.group
    ws = kres.Workspace.new(batch, k_queries * k, g.hot_slots, g.device)
    for frac, shift in ((0.0, 7), (0.5, 7), (0.0, 0)):  # the last: the tags agree
        sel = selections(plain, rids, k_queries, k, frac, gen)
        want = sync_free_round(plain, None, rids, sel, True)
        got = sync_free_round(sync_free, ws, rids, sel, False,
                              between=lambda w, d=shift: setattr(w, "call", w.call + d))
        assert int(want["totals"][kres.R_COPIES]) > 0, seed  # copy blocks at work
        assert_rounds_agree(want, got, seed, frac)
        assert_same(snapshot(plain), snapshot(sync_free))
        sync_free.check()
        # no block preloaded while the tags differed (R_PRELOADS sums the workspace's calls)
        assert (got["preloads"] > 0) == (shift == 0), (seed, frac, got["preloads"])


@pytest.mark.gpu
@pytest.mark.parametrize("case,overflows", [((17, 3, 40, 64, 2048, 1152), False),
                                            ((9, 8, 64, 4, 300, 656), True)],
                         ids=["b17-R1152", "b9-R656-staging-overflow"])
def test_sync_free_copies_by_tma_with_and_without_the_preload(case, overflows,
                                                              monkeypatch) -> None:
    """The sync-free commit copying by the tensor memory accelerator, its rows' first bulk
    copies issued before the lookup ended (preload, built in with
    DHISPARSE_RESOLVER_TMA_PRELOAD=1) or after (the default build, which never preloads rows
    that go by TMA, and the preload switched off): what plain launches copying by loads
    give. The second case's union exceeds its hot slots and staging, so some rounds are
    refused after the preload sent rows to shared memory (they land before the block
    leaves)."""
    from kernels import resolver as kres

    batch, k_queries, k, hot, staging, row_bytes = case
    seed = random.randrange(1 << 30)
    plain, sync_free, rids = make_pair(seed, batch, k_queries, hot, staging, row_bytes)
    _, default_build, _ = make_pair(seed, batch, k_queries, hot, staging, row_bytes)
    _, no_preload, _ = make_pair(seed, batch, k_queries, hot, staging, row_bytes)
    names = commit_kernels(monkeypatch)
    gen = torch.Generator().manual_seed(seed)
    refused = preloaded = 0  # refused: after a preload
    for frac in (0.0, 0.5, 0.0, 0.8, 0.0):
        sel = selections(plain, rids, k_queries, k, frac, gen)
        sel[0, 0, 0] = 0  # a copy every round (make_pair: request 0's row 0 is host-only)
        monkeypatch.setenv("DHISPARSE_COPY_TMA", "0")
        want = sync_free_round(plain, None, rids, sel, True)
        monkeypatch.setenv("DHISPARSE_COPY_TMA", "1")
        outs = []
        for h, early, build in ((sync_free, "1", "1"), (default_build, "1", "0"),
                                (no_preload, "0", "0")):
            monkeypatch.setenv("DHISPARSE_COPY_EARLY", early)
            monkeypatch.setenv("DHISPARSE_RESOLVER_TMA_PRELOAD", build)
            outs.append(sync_free_round(h, None, rids, sel, False))
            assert_rounds_agree(want, outs[-1], seed, frac, early)
            assert_same(snapshot(plain), snapshot(h))
            h.check()
        assert outs[1]["preloads"] == outs[2]["preloads"] == 0, (seed, frac)
        preloaded += outs[0]["preloads"] > 0  # a fresh workspace each round: this call's
        refused += outs[0]["preloads"] > 0 and int(want["totals"][kres.R_STATUS]) != 0
    assert preloaded > 0, seed  # the preload issued bulk copies
    if overflows:  # refused calls whose preload sent rows (drained)
        assert refused > 0, seed
    # the plain side by loads, both sync-free sides by TMA
    assert names == {"resolve_commit_16", "resolve_commit_16_tma"}, names


# batch, K, k, hot slots, staging rows, row bytes: a warp-summed batch (<= 32) and one above
# the SM count (summed by the whole block); round 0 of each misses without staging
PENDING_CASES = [(5, 2, 24, 64, 512, 16), (160, 1, 16, 16, 4096, 12)]
# hit fractions (1.0: every row held); "bad": every row held and one at its causal bound
ROUNDS = (0.0, 1.0, 1.0, 0.5, 1.0, "bad", 1.0, 0.0, 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["1", "2x512"])  # DHISPARSE_LOOKUP_BLOCKS
@pytest.mark.parametrize("hits", ["index", "rank"])  # DHISPARSE_LOOKUP_HITS
@pytest.mark.parametrize("case", PENDING_CASES,
                         ids=lambda c: "b{}-K{}-k{}-B{}-S{}-R{}".format(*c))
def test_one_workspace_across_rounds_with_and_without_pending_work(case, shape, hits,
                                                                   monkeypatch) -> None:
    from kernels import resolver as kres

    monkeypatch.setenv("DHISPARSE_LOOKUP_BLOCKS", shape)
    monkeypatch.setenv("DHISPARSE_LOOKUP_HITS", hits)
    batch, k_queries, k, hot, staging, row_bytes = case
    seed = random.randrange(1 << 30)  # printed on failure
    plain, sync_free, rids = make_pair(seed, batch, k_queries, hot, staging, row_bytes)
    gen = torch.Generator().manual_seed(seed)
    g = sync_free.group
    ws = kres.Workspace.new(batch, k_queries * k, g.hot_slots, g.device)
    seen, after_stray = [], False
    for rnd, frac in enumerate(ROUNDS):
        sel = selections(plain, rids, k_queries, k, 1.0 if frac == "bad" else frac, gen)
        if frac == "bad":  # flagged by the lookup: the commit must refuse, either way
            sel[0, 0, 0] = plain.causal_bounds(rids, k_queries)[0, 0]
        want = sync_free_round(plain, None, rids, sel, True)
        got = sync_free_round(sync_free, ws, rids, sel, False)
        assert_rounds_agree(want, got, seed, rnd)
        assert_same(snapshot(plain), snapshot(sync_free))
        sync_free.check()
        t = want["totals"]
        copies, staged, status = (int(t[c]) for c in (kres.R_COPIES, kres.R_STAGED,
                                                       kres.R_STATUS))
        if copies or status:  # this call's own work is pending, whatever came before
            assert got["pending"] > 0, (seed, rnd)
        elif not after_stray:  # the previous commit cleared this call's slots
            assert got["pending"] == 0, (seed, rnd, got["pending"])
        seen.append((frac, copies, staged, status, got["pending"]))
        after_stray = rnd % 3 == 2
        if after_stray:  # a stray lookup with misses: its slots stay dirty (no commit)
            stray = selections(plain, rids, k_queries, k, 0.0, gen)
            sync_free_round(sync_free, ws, rids, stray, False, commit=False)
            assert_same(snapshot(plain), snapshot(sync_free))  # a lookup mutates no state
    # every kind of round came up: no pending work, copies without staging, bad input
    assert any(p == 0 for *_, p in seen), seen
    assert any(c > 0 and s == 0 for _, c, s, _, _ in seen), seen
    assert all(st != 0 for f, _, _, st, _ in seen if f == "bad"), seen
