"""``bench.bench_host_gather``'s gather patterns: regions of one history each, or rows drawn
from the whole pool; a malformed pattern is refused by name."""

from __future__ import annotations

import pytest
import torch

from bench.bench_host_gather import call_rows, label, parse_pattern


def test_region_and_pool_patterns_parse() -> None:
    assert parse_pattern("160:410") == (160, 410, "")
    for order in ("same", "across", "peer"):
        assert parse_pattern(f"160:410:{order}") == (160, 410, order)
    assert parse_pattern("pool:65536") == (0, 65536, "")
    assert parse_pattern("pool:65536:shuffled") == (0, 65536, "shuffled")
    assert label(0, 65536, "shuffled") == "pool x  65536 shuffled"
    assert label(160, 410, "") == " 160 x    410"


@pytest.mark.parametrize("bad", ["160", "160:410:shuffled", "pool:4096:same", "1:2:3:4"])
def test_a_malformed_pattern_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ValueError, match="pattern="):
        parse_pattern(bad)


def test_a_calls_rows_come_in_the_patterns_order() -> None:
    g = torch.Generator().manual_seed(0)
    seq_len, nreg, nrows = 50, 3, 7
    perm = torch.stack([torch.randperm(seq_len, generator=g) for _ in range(nreg)])
    by_region = [set((perm[r, 5:12] + r * seq_len).tolist()) for r in range(nreg)]
    plain = call_rows(perm, nreg, nrows, "", 5, seq_len)
    assert plain.tolist() == sorted(plain.tolist())  # region after region, ascending
    assert [set(plain[r * nrows : (r + 1) * nrows].tolist()) for r in range(nreg)] == by_region
    across = call_rows(perm, nreg, nrows, "across", 5, seq_len).view(nrows, nreg)
    assert torch.equal(across.t().reshape(-1), plain)  # the i-th row of every region, in turn
    peer = call_rows(perm, nreg, nrows, "peer", 5, seq_len).view(nrows, nreg)
    for r in range(nreg):  # region r's rows in perm's (random) order
        assert peer[:, r].tolist() == (perm[r, 5:12] + r * seq_len).tolist()
    assert call_rows(perm, nreg, nrows, "", 48, seq_len)[:2].tolist() == sorted(
        perm[0, [48, 49, 0, 1, 2, 3, 4]].tolist())[:2]  # positions wrap around the region
    pool = torch.randperm(40, generator=g)[None]
    assert call_rows(pool, 0, 6, "shuffled", 3, 0).tolist() == pool[0, 3:9].tolist()
    assert call_rows(pool, 0, 6, "", 3, 0).tolist() == sorted(pool[0, 3:9].tolist())
