"""I3 through the benchmark driver: the five policies emit identical greedy token streams
in batch-invariant mode, for both topologies, including a hot cache far smaller than k
(host misses every step) and a budget that forces reclaim and repopulation mid-run."""

from __future__ import annotations

import functools

import pytest

from services.decode.bench.serve import ServeResult, run_serve
from services.decode.bench.settings import ALL_POLICIES, BenchSettings

# tiny preset: k = 8, 2 source groups; an 8-row page is 2 KiB (glm: 2 payloads per group)
# or 1 KiB (deepseek), so a budget of PAGES pages is PAGES · PAGE_KIB KiB.
PAGE_KIB = {"glm": 2, "deepseek": 1}
SCENARIOS = {
    # B = 1 row << k = 8: every step of every offloaded request misses the hot cache.
    "tiny-hot-cache": dict(hot_cache=1, pages=64),
    # resident holds 14 pages per request (1 fits), adaptive 3 required + 8 optional:
    # 4 in flight want 44 of 24 pages -> reclaim; staggered output caps free pages while
    # others still run -> repopulation.
    "reclaim-populate": dict(hot_cache=2, pages=24),
}


@functools.cache
def serve(topology: str, scenario: str) -> ServeResult:
    hot_cache, pages = SCENARIOS[scenario]["hot_cache"], SCENARIOS[scenario]["pages"]
    settings = BenchSettings(
        policy=",".join(ALL_POLICIES), concurrency="4", requests=10, preset="tiny",
        topology=topology, input_len=64, output_len=24, output_range_ratio=0.25,
        page_rows=8, prefixes=3, batch_invariant=True, seed=3, hot_cache=hot_cache,
        kv_memory=f"{pages * PAGE_KIB[topology]}KiB")
    return run_serve(settings.validate())


def row(result: ServeResult, policy: str) -> dict[str, object]:
    return next(r for r in result.rows if r["policy"] == policy)


CASES = [(t, s) for t in ("glm", "deepseek") for s in SCENARIOS]


@pytest.mark.parametrize(("topology", "scenario"), CASES)
def test_policies_emit_identical_tokens(topology: str, scenario: str) -> None:
    result = serve(topology, scenario)
    reference = result.tokens["resident"]["4"]
    assert len(reference) == 10
    assert len({tuple(t) for t in reference.values()}) > 3, "streams should differ"
    caps = [len(t) for t in reference.values()]
    assert min(caps) >= 6 and max(caps) <= 24 and len(set(caps)) > 1
    for policy in ALL_POLICIES[1:]:
        got = result.tokens[policy]["4"]
        assert got.keys() == reference.keys()
        for rid, tokens in reference.items():
            assert got[rid] == tokens, f"{policy} {rid} diverges from resident"


@pytest.mark.parametrize("topology", ["glm", "deepseek"])
def test_tiny_hot_cache_misses_every_step(topology: str) -> None:
    result = serve(topology, "tiny-hot-cache")
    hisparse = row(result, "hisparse")
    assert hisparse["host_fetch_steps"] == 1.0
    assert hisparse["host_fetch_share"] > 0.8
    assert row(result, "resident")["host_fetched_rows"] == 0


@pytest.mark.parametrize("topology", ["glm", "deepseek"])
def test_budget_forces_reclaim_and_repopulation(topology: str) -> None:
    result = serve(topology, "reclaim-populate")
    for policy in ("adaptive", "adaptive-spec"):
        commands = result.commands[policy]["4"]
        assert commands.get("backup", 0) > 0, (policy, commands)
        assert commands.get("retire", 0) > 0, (policy, commands)
        assert commands.get("populate", 0) > 0, (policy, commands)
        r = row(result, policy)
        assert r["reclaimed_pages"] == commands["retire"]
        assert r["populated_pages"] == commands["populate"]
        assert 0.0 < r["coverage_mean"] < 1.0
    assert row(result, "resident")["active_mean"] < row(result, "adaptive")["active_mean"]


@pytest.mark.parametrize("topology", ["glm", "deepseek"])
def test_speculative_policies_emit_more_than_one_token_per_round(topology: str) -> None:
    result = serve(topology, "reclaim-populate")
    for policy in ("resident-spec", "adaptive-spec"):
        assert row(result, policy)["spec_tokens_per_round"] > 1.0
    for policy in ("resident", "hisparse", "adaptive"):
        assert row(result, policy)["spec_tokens_per_round"] == 1.0
