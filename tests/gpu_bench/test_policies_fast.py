"""Exactness across policies with the fast (not batch-invariant) forward (I3).

At a fixed batch composition (every request admitted in the first step, same output
caps) a policy changes only where selected rows live, never their bytes, their order or
any tensor shape, so resident, hisparse and adaptive emit identical greedy tokens, with
hisparse fetching from host and adaptive serving from optional pages.
"""

from __future__ import annotations

from services.decode.bench.driver import LoadPhase, drive
from services.decode.engine.config import EngineConfig
from services.decode.gpu_bench.engine import GpuEngine, Shared
from services.decode.model.fast import FastDSAModel


def _config(policy: str, hot: int = 8) -> EngineConfig:
    return EngineConfig(policy=policy, preset="tiny", topology="deepseek", page_rows=8,
                        kv_memory=400 * 8 * 2 * 16 * 4, hot_cache=hot, max_requests=4,
                        max_context=128, spec_block=4)


def _serve(policy: str, shared: Shared):
    engine = GpuEngine(_config(policy), shared)
    prefixes = [[(7 * i + j) % 64 for j in range(40 + 8 * i)] for i in range(4)]
    rec = drive(engine, policy, [LoadPhase(4, requests=4)], prefixes, 16)
    return engine, {r.request_id: r.output for r in rec.runs}


def test_resident_hisparse_adaptive_identical_with_fast_path() -> None:
    shared = Shared.build(_config("resident").model)
    runs = {p: _serve(p, shared) for p in ("resident", "hisparse", "adaptive")}
    assert isinstance(runs["resident"][0].model, FastDSAModel)
    ref = runs["resident"][1]
    assert len(ref) == 4 and all(len(t) == 16 for t in ref.values())
    for policy, (_, out) in runs.items():
        assert out == ref, policy
    hs, ad = runs["hisparse"][0].stats.counts, runs["adaptive"][0].stats.counts
    assert hs.host > 0 and ad.host < hs.host  # the policies did take different paths
    assert runs["adaptive"][0].stats.coverage_mean > 0.9


def test_speculative_policies_identical_to_each_other() -> None:
    """resident-spec vs adaptive-spec: same [B, K] round shapes, same tokens."""
    shared = Shared.build(_config("resident").model)
    a = _serve("resident-spec", shared)
    b = _serve("adaptive-spec", shared)
    assert a[1] == b[1]
    assert a[0].stats.tokens_per_round > 1.0


def test_profile_step_attributes_the_model_stages() -> None:
    from services.decode.bench.settings import BenchSettings
    from services.decode.gpu_bench.runner import profile_step

    s = BenchSettings(preset="tiny", topology="deepseek", input_len=40, output_len=12,
                      hot_cache=8, kv_memory="1MiB", page_rows=8, max_context=64,
                      concurrency="2", requests=2, prefixes=2).validate()
    shared = Shared.build(s.engine_config("resident", 1).model)
    out = profile_step(s, "hisparse", 2, shared, fused=False)
    assert out["active"] == 2 and out["wall_ms_per_step"] > 0
    assert {"indexer", "resolver", "attention", "mlp", "gather_rows"} <= set(out["stages"])


def test_point_cap_stops_with_requests_in_flight_and_rates_still_count() -> None:
    """``drive(max_seconds=...)``: a capped point ends after the step crossing the cap with
    the rest unfinished, flagged ``truncated``; an uncapped run of the same is not."""
    import pytest

    from services.common.errors import InvalidArgument
    from services.decode.bench.metrics import serve_row

    shared = Shared.build(_config("resident").model)
    prefixes = [[(7 * i + j) % 64 for j in range(40)] for i in range(2)]
    ticks = iter(range(10_000))
    engine = GpuEngine(_config("hisparse"), shared)
    engine.clock = lambda: next(ticks) / 100  # 10 ms per clock read
    rec = drive(engine, "hisparse", [LoadPhase(4, requests=8)], prefixes, 16, max_seconds=1)
    row = serve_row(rec, 4)
    assert rec.truncated and row["truncated"]
    assert {"admission", "activate"} <= set(row["host_phase_seconds"])
    assert 0 < row["output_tokens"] and row["finished_requests"] < 8
    assert len(rec.samples) > 2 and rec.samples[-2].t < 1 <= rec.samples[-1].t
    full = drive(GpuEngine(_config("hisparse"), shared), "hisparse", [LoadPhase(4, requests=8)],
                 prefixes, 4)
    assert not full.truncated and serve_row(full, 4)["finished_requests"] == 8
    with pytest.raises(InvalidArgument, match="max_seconds=0"):
        drive(GpuEngine(_config("hisparse"), shared), "hisparse", [LoadPhase(1, requests=1)],
              prefixes, 4, max_seconds=0)
