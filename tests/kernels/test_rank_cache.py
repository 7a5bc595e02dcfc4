"""The rank form of the lookup's hot hits (kernels/resolver_rank.cuh) reads the requests'
hot_rank caches where they are valid and rebuilds them where a writer of hot_rows made them
stale: a valid cache is what the lookup uses (a corrupted one gives wrong locations), a
stale one is never used (a corrupted one is rebuilt, the round matches the reference), and
the caches the lookup writes pass the I4 check after every round."""

from __future__ import annotations

import random

import pytest
import torch

from services.decode.hierarchy.request import RANK_BUILT, RANK_VERSION, rank_layout
from tests.kernels.test_fused_resolver import check_round, make_pair, selections

BATCH, K, k, HOT, STAGING, ROW_BYTES = 4, 1, 48, 64, 256, 16


def _valid(h, rids) -> list[bool]:
    return [int(h.group.request(r).hot_rank[RANK_BUILT])
            == int(h.group.request(r).hot_rank[RANK_VERSION]) for r in rids]


def _corrupt(h, rid: str, part: str) -> None:
    """Every cached entry of ``rid`` points one pool row further, or the cached prefix of
    every word past the first counts one held row more (a held row there takes the next
    one's entry: the selections hit rows past 32); the header untouched."""
    s = h.group.request(rid)
    ent_at, _, pre_at, _ = rank_layout(s.max_rows, s.hot_rows.numel())
    if part == "entries":
        s.hot_rank[ent_at : ent_at + HOT] += 1 << 20
    else:
        s.hot_rank[pre_at:].view(torch.int16)[1:] += 1


def _hit_past_first_word(h, rid: str, sel_b: torch.Tensor, seed: int) -> None:
    """Make ``sel_b`` (the request's [K, k] selection) hit a held row past the first 32 rows
    with a held row after it, unless it does already: with the corrupted prefix that entry
    takes the next held row's location. (Random draws missed every such row now and then:
    a short history holds rows below 32 only; run 150's failure.)"""
    held = sorted(r for r in h.hot_rows(rid) if r >= 0)
    rows = [r for r in held[:-1] if r >= 32]
    assert rows, (seed, held)  # histories of 100 rows and more (make_pair below)
    if not torch.isin(sel_b, torch.tensor(rows, device=sel_b.device)).any():
        sel_b[:, 0] = rows[0]  # in no query before: still distinct rows


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["1", "2x512"])  # DHISPARSE_LOOKUP_BLOCKS
@pytest.mark.parametrize("part", ["entries", "prefix"])
def test_rank_form_uses_a_valid_cache_and_rebuilds_a_stale_one(shape, part, monkeypatch) -> None:
    monkeypatch.setenv("DHISPARSE_LOOKUP_BLOCKS", shape)
    monkeypatch.setenv("DHISPARSE_LOOKUP_HITS", "rank")
    seed = random.randrange(1 << 30)  # printed on failure
    gen = torch.Generator().manual_seed(seed)
    for bump in (True, False):
        h_ref, h_k, rids = make_pair(seed, BATCH, K, HOT, STAGING, ROW_BYTES,
                                     imported_range=(100, 300))
        check_round(h_ref, h_k, rids, selections(h_ref, rids, K, k, 0.0, gen))  # misses
        assert not _valid(h_k, rids)[0], seed  # its misses took slots: the cache is stale
        for _ in range(2):  # rebuilt by the first all-hit lookup, read by the second
            check_round(h_ref, h_k, rids, selections(h_ref, rids, K, k, 1.0, gen))
            assert all(_valid(h_k, rids)), seed  # no slot taken: no writer bumped
        _corrupt(h_k, rids[0], part)
        sel = selections(h_ref, rids, K, k, 1.0, gen)
        _hit_past_first_word(h_k, rids[0], sel[0], seed)
        if bump:  # stale: rebuilt from hot_rows, the corruption gone
            h_k.group.request(rids[0]).hot_rank[RANK_VERSION] += 1
            check_round(h_ref, h_k, rids, sel)
            assert all(_valid(h_k, rids)), seed
        else:  # valid: read as it is, so hits of rids[0] land on other pool rows
            with pytest.raises(AssertionError, match="locations"):
                check_round(h_ref, h_k, rids, sel)
