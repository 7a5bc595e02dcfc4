"""The fused CUDA resolver against the reference by the shape of a round's queries: K
identical selections (the round's queries sharing one selection under causal bounds:
resolver_lookup.cu same_queries) and one query in the rank form. Same harness and checks as
test_fused_resolver.py: plan and state bit-exact after every call, bad input refused alike
with nothing changed."""

from __future__ import annotations

import random

import pytest
import torch

from tests.kernels.test_fused_resolver import REF_DEVICE, check_round, make_pair, selections


@pytest.mark.gpu
def test_identical_queries_with_a_row_past_the_first_querys_bound_raise_like_the_reference(
) -> None:
    """Identical queries under causal bounds: a row at the first query's bound is bad there
    and good for the later queries; the call is refused as the reference refuses it, nothing
    changed. (A lookup that took the first of identical queries for all must flag it too:
    tried in 1c78c2c, runs 90-91.)"""
    h_ref, h_k, rids = make_pair(13, 3, 8, 16, 512, 656, ref_device=REF_DEVICE)
    gen = torch.Generator().manual_seed(13)
    for _ in range(2):  # a good round first: the shared selection resolves, then the bad one
        sel = selections(h_ref, rids, 8, 40, 0.3, gen, same_queries=True)
        vis = h_ref.causal_bounds(rids, 8).cpu()
        assert (vis[:, 1:] > vis[:, :1]).any()  # the later queries see more rows
        assert check_round(h_ref, h_k, rids, sel) is not None
    b = int((vis[:, -1] > vis[:, 0]).nonzero()[0])
    sel[b, :, 5] = int(vis[b, 0])  # past query 0's bound only
    assert check_round(h_ref, h_k, rids, sel) is None


@pytest.mark.gpu
def test_identical_rows_under_a_lower_later_bound_resolve_like_the_reference() -> None:
    """Identical rows whose later query has a lower visible bound than the first's: the rows
    all below every bound resolve exactly as the reference does, and a row between the two
    bounds is refused."""
    h_ref, h_k, rids = make_pair(17, 2, 4, 16, 512, 656, ref_device=REF_DEVICE)
    gen = torch.Generator().manual_seed(17)
    sel = selections(h_ref, rids, 4, 40, 0.3, gen, same_queries=True)
    vis = h_ref.causal_bounds(rids, 4).cpu()
    vis[:, 2] = vis[:, 0] - 1  # query 2 sees one row fewer than query 0
    sel[sel >= vis[:, 2, None, None]] = -1
    assert check_round(h_ref, h_k, rids, sel, vis=vis) is not None
    sel[0, :, 3] = int(vis[0, 2])  # good for query 0, past query 2's bound
    assert check_round(h_ref, h_k, rids, sel, vis=vis) is None


@pytest.mark.gpu
def test_queries_without_entries_under_unequal_bounds_resolve_nothing() -> None:
    """K = 4 queries of k = 0 entries, a later bound below the first's: the lookup launch
    ends (the identical-queries kernels, which would loop there, are not taken) and counts
    nothing; the locations tensor is empty."""
    from kernels import dropin
    from kernels import resolver as kres

    _, h_k, rids = make_pair(5, 3, 4, 16, 512, 656, ref_device=REF_DEVICE)
    g = h_k.group
    vis = h_k.causal_bounds(rids, 4).to(g.device)
    vis[:, 2] = vis[:, 0] - 1
    sel = torch.empty(len(rids), 4, 0, dtype=torch.int64, device=g.device)
    ws = kres.Workspace.new(len(rids), 0, g.hot_slots, g.device)
    kres.lookup(ws, dropin.request_table(g, [g.request(r) for r in rids]), sel, vis,
                torch.empty_like(sel), hot_slots=g.hot_slots, tail_rows=g.config.tail_rows,
                page_rows=g.config.page_rows,
                rows_bound=max(g.request(r).tail_lo for r in rids),
                finished_epoch=g.finished_epoch)
    totals = ws.totals[: kres.TOT_COLS].cpu()
    assert int(totals[kres.R_STATUS]) == 0 and int(totals[kres.R_COPIES]) == 0
    assert int(totals[kres.R_DIRECT]) == len(rids)  # every request direct: nothing to look up


@pytest.mark.gpu
def test_identical_queries_copy_each_row_once() -> None:
    h_ref, h_k, rids = make_pair(7, 4, 8, 64, 1024, 656, ref_device=REF_DEVICE)
    gen = torch.Generator().manual_seed(7)
    sel = selections(h_ref, rids, 8, 48, 0.0, gen, same_queries=True)
    plan = check_round(h_ref, h_k, rids, sel)
    assert plan is not None
    unique = sum(int(torch.unique(sel[b][(sel[b] >= 0)]).numel()) for b in range(len(rids)))
    assert plan.copy_rows.numel() <= unique and plan.counts.host_rows == plan.copy_rows.numel()


@pytest.mark.gpu
@pytest.mark.parametrize("blocks", ["1", "2x512"])
@pytest.mark.parametrize("batch,k", [(1, 37), (40, 301), (150, 64)])
def test_one_query_rank_form_resolves_like_the_reference(
    batch: int, k: int, blocks: str, monkeypatch
) -> None:
    """K = 1 in the rank form (the benchmark's shape above the SM count; the cases above
    take it at batch 1 only): exactly as the reference, odd k included; a row at its bound
    and a negative bound are refused like the reference's, nothing changed, and the next
    good call resolves. (Run 136 had these read the selection and bound from shared memory:
    green, and slower; reverted.)"""
    monkeypatch.setenv("DHISPARSE_LOOKUP_BLOCKS", blocks)
    monkeypatch.setenv("DHISPARSE_LOOKUP_HITS", "rank")
    seed = random.randrange(1 << 30)  # fresh inputs every run; printed on failure
    h_ref, h_k, rids = make_pair(seed, batch, 1, 320, 4096, 24, ref_device=REF_DEVICE)
    gen = torch.Generator().manual_seed(seed)
    resolved = 0
    for hit_frac in (0.0, 1.0, 0.9, 1.0, -1.0, 0.5):
        sel = selections(h_ref, rids, 1, k, hit_frac, gen)
        resolved += check_round(h_ref, h_k, rids, sel) is not None
    assert resolved >= 4, (seed, resolved)  # the slots hold every request's k rows
    sel = selections(h_ref, rids, 1, k, 1.0, gen)
    vis = h_ref.causal_bounds(rids, 1).cpu()
    bad = sel.clone()
    bad[batch - 1, 0, k - 1] = int(vis[batch - 1, 0])  # at the bound: past the visible rows
    assert check_round(h_ref, h_k, rids, bad) is None
    bad_vis = vis.clone()
    bad_vis[batch // 2, 0] = -1
    assert check_round(h_ref, h_k, rids, sel, vis=bad_vis) is None
    assert check_round(h_ref, h_k, rids, sel) is not None


@pytest.mark.gpu
@pytest.mark.parametrize("hits", ["index", "rank"])
@pytest.mark.parametrize("blocks", ["1", "2x512"])
@pytest.mark.parametrize("K,k", [(9, 1100), (15, 600)])
def test_queries_differing_past_the_first_seven_or_past_a_block_resolve_like_the_reference(
    K: int, k: int, blocks: str, hits: str, monkeypatch
) -> None:
    """same_queries compares 7 queries' entries at a time, two entries a thread: identical
    selections of K > 8 queries resolve as the reference does, and so do the same with one
    entry changed in the last query at the last index (past 1024 entries: a thread's second
    entry, or a second round of the 512-thread kernels) or in query 8 (the second group of
    7). A check that looked at the first group only, or at one entry a thread, would give
    the changed query the first's locations."""
    monkeypatch.setenv("DHISPARSE_LOOKUP_BLOCKS", blocks)
    monkeypatch.setenv("DHISPARSE_LOOKUP_HITS", hits)
    seed = random.randrange(1 << 30)  # fresh inputs every run; printed on failure
    # three rounds without a fence each stage up to ~350 rows: 4096 staging rows hold them
    h_ref, h_k, rids = make_pair(seed, 3, K, 64, 4096, 656, ref_device=REF_DEVICE,
                                 imported_range=(100, 300))
    gen = torch.Generator().manual_seed(seed)
    sel = selections(h_ref, rids, K, k, 0.5, gen, same_queries=True)
    assert check_round(h_ref, h_k, rids, sel) is not None, seed
    vis = h_ref.causal_bounds(rids, K).cpu()
    for j, i in ((K - 1, k - 1), (8, k // 2)):
        sel = selections(h_ref, rids, K, k, 0.5, gen, same_queries=True)
        b = int(torch.randint(0, len(rids), (1,), generator=gen))
        sel[b, j, i] = (int(sel[b, 0, i]) + 1) % int(vis[b, 0])  # below every query's bound
        assert sel[b, j, i] != sel[b, 0, i]
        assert check_round(h_ref, h_k, rids, sel) is not None, (seed, j, i)
