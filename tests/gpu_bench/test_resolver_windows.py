"""The resolver benchmark's row windows (``bench.resolver.pool``): how many calls a case can
time on rows no earlier call read, and how a sweep's settings share them; its request table;
its plot; its memcpy ceiling. CPU only."""

from __future__ import annotations

import pytest
import torch

from bench.resolver.pool import PAGE_ROWS, State, Windows


def test_windows_count_calls_that_read_no_row_twice() -> None:
    st = State(2, 10 * PAGE_ROWS + 1, 8, torch.device("cpu"))  # tail_lo = 640 rows
    assert st.tail_lo == 640 and st.nonres.shape[1] == 632
    assert st.windows(64, 64, cold=True) == 10  # any row: 640 // 64
    assert st.windows(64, 13, cold=False) == 48  # never-resident rows only: 632 // 13
    assert st.windows(64, 0, cold=False) == 1 << 30  # nothing missed: no limit


def test_the_benchmarks_table_names_each_column_the_kernels_read() -> None:
    from kernels.resolver import TABLE_COLUMNS
    from services.decode.hierarchy.request import rank_words

    st = State(2, 10 * PAGE_ROWS + 1, 8, torch.device("cpu"))
    table, at = st.table(2), {c: i for i, c in enumerate(TABLE_COLUMNS)}
    assert table.shape == (2, len(TABLE_COLUMNS))
    for r in range(2):
        for name, t in (("hot_rows", st.hot_rows), ("hot_stamp", st.stamp),
                        ("hot_locs", st.hot_locs),
                        ("tail_locs", st.tail_locs), ("page_map", st.page_map),
                        ("page_ready", st.page_ready), ("hot_index", st.hot_index),
                        ("hot_rank", st.hot_rank)):
            assert table[r, at[name]].item() == t[r].data_ptr(), (r, name)
        assert table[r, at["rank_cap"]].item() == rank_words(st.S)
        assert (table[r, at["tail_lo"]].item(), table[r, at["tail_hi"]].item()) == (
            st.tail_lo, st.S)


def test_settings_take_fresh_windows_and_start_over_when_a_case_runs_out() -> None:
    w = Windows()
    assert [w.take("a", 4, 10), w.take("a", 4, 10)] == [0, 4]
    assert w.take("b", 4, 10) == 0  # per case
    assert w.take("a", 4, 10) == 0  # 8 + 4 > 10: start over
    assert w.take("a", 4, 10) == 4
    assert [w.take("c", 5, 10), w.take("c", 5, 10), w.take("c", 5, 10)] == [0, 5, 0]  # exact fit
    with pytest.raises(ValueError, match="11 calls need more row windows than the 10 of case a"):
        w.take("a", 11, 10)


def test_the_committed_results_draw_with_every_panel(tmp_path) -> None:
    """``bench.resolver.plot`` over the committed run: one line per side and profile where
    the data has it, the PNG written (what ``merge_files`` does after a peer merge)."""
    import json
    from pathlib import Path

    from bench.resolver.plot import PROFILES, SERIES, plot, series

    root = Path(__file__).resolve().parents[2]
    rec = json.loads((root / "bench/results/resolver_h200.json").read_text())
    for _, layout, _ in SERIES:
        for profile, _, kind in PROFILES:
            x, y = series(rec, layout, 656, 2048, profile, kind)
            assert x == [1, 8, 32, 160] and all(v > 0 for v in y), (layout, profile)
    out = plot(rec, tmp_path / "r.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    with pytest.raises(ValueError, match="no cases with top_k=7"):
        plot(rec, tmp_path / "none.png", top_k=7)


def test_restore_makes_the_rank_caches_stale_only_after_calls_that_changed_the_held_rows() -> None:
    """Timed no-miss calls find the rank form's cache valid (as in serving); a restore after
    calls whose misses took slots (``held_changed``, set by ``Case.call``) bumps every
    request's version, as the writers of hot_rows do."""
    from services.decode.hierarchy.request import RANK_BUILT, RANK_VERSION

    st = State(2, 10 * PAGE_ROWS + 1, 8, torch.device("cpu"))
    assert st.hot_rank[:, RANK_BUILT].tolist() == [-1, -1]  # never built
    st.restore(cold=False)  # the first restore: the state was never laid out
    st.restore(cold=False)
    assert st.hot_rank[:, RANK_VERSION].tolist() == [1, 1]
    st.restore(cold=True)  # no call changed them, but cold empties the caches
    st.restore(cold=True)
    assert st.hot_rank[:, RANK_VERSION].tolist() == [2, 2]
    st.held_changed = True
    st.restore(cold=True)
    assert st.hot_rank[:, RANK_VERSION].tolist() == [3, 3] and not st.held_changed


def test_the_ceiling_is_the_faster_memcpy_and_the_fractions_follow_it() -> None:
    from bench.resolver.runs import settle_ceiling

    rec = {"ceiling": {"h2d_pinned_1GiB_GBps": 50.0},
           "cases": [{"GBps": 25.0, "frac_of_h2d_memcpy": 0.5}, {"us_per_call": 12.0}]}
    settle_ceiling(rec, 55.0)
    assert rec["ceiling"] == {"h2d_pinned_1GiB_GBps": 55.0,
                              "h2d_pinned_1GiB_GBps_runs": [50.0, 55.0]}
    assert rec["cases"][0]["frac_of_h2d_memcpy"] == 25.0 / 55.0
    assert "frac_of_h2d_memcpy" not in rec["cases"][1]
    settle_ceiling(rec, 40.0)  # a slower second measurement keeps the faster one
    assert rec["ceiling"]["h2d_pinned_1GiB_GBps"] == 55.0


def test_the_memcpy_ceiling_of_a_pool_below_its_size_copies_the_whole_pool(monkeypatch) -> None:
    """A pool of fewer bytes than the memcpy's 1 GiB (a short ``--seq-len``) is measured
    whole, not refused by a size mismatch (run 159 at 10K-row requests)."""
    import bench.common as common

    timed = []

    def one_call(fn, reps, warmup, spin=0):
        fn(0)
        timed.append(reps)
        return [2.0]

    monkeypatch.setattr(common, "time_gpu", one_call)
    src = torch.arange(1000, dtype=torch.int32)  # 4000 bytes
    assert common.h2d_memcpy_gbps(torch.device("cpu"), src=src) == 4000 / 2e-6 / 1e9
    assert common.h2d_memcpy_gbps(torch.device("cpu"), nbytes=100, src=src) == 100 / 2e-6 / 1e9
    with pytest.raises(ValueError, match="nbytes=0"):
        common.h2d_memcpy_gbps(torch.device("cpu"), src=src[:0])
    assert timed == [20, 20]


def test_k8_is_skipped_with_its_reason_where_requests_hold_too_few_cold_windows(capsys) -> None:
    """Too few never-read rows for every K = 8 call: recorded as skipped (the cases skip
    alike), nothing timed, and the table says so."""
    from bench.resolver.report import print_table
    from bench.resolver.runs import run_k8

    st = State(2, 10 * PAGE_ROWS + 1, 8, torch.device("cpu"))  # 640 // 64 = 10 cold windows
    rec = {"table_md": "| a |\n|---|\n| 1 |"}
    run_k8({"warmup": 3, "reps": 7}, rec, st, None, None, 656, 64, None)  # 11 calls
    assert rec["k8_identical"] == {
        "skipped": f"seq_len={st.S}: 10 cold windows of 64 rows, 11 calls need one each"}
    print_table(rec)
    assert "K = 8 identical: skipped (seq_len=641" in capsys.readouterr().out


def test_the_memcpy_ceiling_refuses_a_pool_that_is_not_contiguous() -> None:
    """A strided pool would be copied into unpinned memory first: refused, naming it."""
    from bench.common import h2d_memcpy_gbps

    with pytest.raises(ValueError, match=r"src of shape \(4, 2\) is not contiguous"):
        h2d_memcpy_gbps(torch.device("cpu"), src=torch.zeros(4, 4, dtype=torch.uint8)[:, :2])
