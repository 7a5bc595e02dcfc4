"""``bench.bench_host_gather``'s gather patterns: regions of one history each, or rows drawn
from the whole pool; a malformed pattern is refused by name."""

from __future__ import annotations

import pytest

from bench.bench_host_gather import label, parse_pattern


def test_region_and_pool_patterns_parse() -> None:
    assert parse_pattern("160:410") == (160, 410, False)
    assert parse_pattern("160:410:same") == (160, 410, True)
    assert parse_pattern("pool:65536") == (0, 65536, False)
    assert parse_pattern("pool:65536:shuffled") == (0, 65536, True)
    assert label(0, 65536, True) == "pool x  65536 shuffled"
    assert label(160, 410, False) == " 160 x   410"


@pytest.mark.parametrize("bad", ["160", "160:410:shuffled", "pool:4096:same", "1:2:3:4"])
def test_a_malformed_pattern_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ValueError, match="pattern="):
        parse_pattern(bad)
