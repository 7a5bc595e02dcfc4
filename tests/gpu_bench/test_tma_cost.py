"""bench/resolver/tma_cost.py on the CPU: its diagnostic builds exist in the resolver's
source, and its launch wrapper sets what each variant says on the right launch."""

from __future__ import annotations

import json
import os
import re
import types
from pathlib import Path

import torch

from bench.resolver.pool import State, missed_rows, windows_of
from bench.resolver.tma_cost import (
    DEFAULT_VARIANTS,
    VARIANTS,
    Launches,
    differences,
    differences_md,
    floored_copy_blocks,
    schedule,
    set_env,
    windows_needed,
)
from kernels._loader import source


def test_every_diagnostic_build_names_a_switch_of_the_resolver_source() -> None:
    src = source("resolver")
    flags = {f for v in VARIANTS.values() for f in v.flags}
    assert flags  # the probe has diagnostic builds to check
    for flag in flags:
        name = flag.removeprefix("-D").split("=")[0]
        assert re.search(rf"#\s*if(n?def)?\s+{name}\b", src), f"{name}: not in the source"


def test_every_lookup_shape_variant_names_a_shape_the_wrapper_knows(monkeypatch) -> None:
    from kernels.resolver_settings import LOOKUP_SHAPES, lookup_shape

    shapes = {n: v.lookup_blocks for n, v in VARIANTS.items() if v.lookup_blocks is not None}
    assert shapes  # the probe has lookup shapes to check
    monkeypatch.delenv("DHISPARSE_LOOKUP_BLOCKS", raising=False)
    # auto's shapes at batch 32 and 160 on 132 SMs: (1024, 1) and (512, 2)
    auto = [lookup_shape(batch, 132) for batch in (32, 160)]
    for name, shape in shapes.items():
        monkeypatch.setenv("DHISPARSE_LOOKUP_BLOCKS", shape)
        pinned = [lookup_shape(batch, 132) for batch in (32, 160)]
        # one shape at every batch, and not auto's at one of them at least
        assert pinned == [LOOKUP_SHAPES[shape]] * 2 != auto, name


def test_set_env_sets_or_unsets(monkeypatch) -> None:
    monkeypatch.setenv("DHISPARSE_LOOKUP_BLOCKS", "2")
    set_env("DHISPARSE_LOOKUP_BLOCKS", "2x512")
    assert os.environ["DHISPARSE_LOOKUP_BLOCKS"] == "2x512"
    set_env("DHISPARSE_LOOKUP_BLOCKS", None)
    assert "DHISPARSE_LOOKUP_BLOCKS" not in os.environ


def test_the_default_variants_read_fresh_rows_in_every_call_of_a_round() -> None:
    m = missed_rows("miss20", 2048)
    have = windows_of(100_000, 4096, 2048, m, False)
    # two 20%-miss cases a round (batch 32 and 160), 15 timed calls each
    assert 2 * windows_needed(list(DEFAULT_VARIANTS), 15, True) <= have
    assert 2 * windows_needed(list(VARIANTS), 15, True) > have  # all of them would not fit
    assert windows_needed(["tma_no_shared"], 15, True) == 0  # runs no case with misses
    assert windows_needed(["tma_no_shared"], 15, False) == 18


def test_windows_of_counts_the_rows_a_state_draws_from() -> None:
    st = State(2, 1000, 64, torch.device("cpu"))
    for k, m in ((64, 13), (128, 100), (64, 936)):  # warm: m never-read rows a call
        assert windows_of(1000, 64, k, m, False) == st.nonres.shape[1] // m
    for k in (64, 100):  # cold: k rows of any kind a call
        assert windows_of(1000, 64, k, k, True) == st.cold_order.shape[1] // k
    assert windows_of(1000, 64, 64, 0, False) == 1 << 30  # no never-read rows needed


class _Fn:
    def __init__(self) -> None:
        self.preferred_shared_memory_carveout = -1
        self.max_dynamic_shared_size_bytes = 48 * 1024


def test_the_wrapper_sets_carveouts_apart_and_the_commits_shared_memory_only() -> None:
    calls = []
    kres = types.SimpleNamespace(
        defines=lambda: (),
        launch=lambda fn, grid, block, args, shared=0: calls.append(("lookup", shared)),
        launch_dependent=lambda fn, grid, block, args, shared=0: calls.append(("commit", shared)),
    )
    wrap = Launches(kres)
    wrap.flags = ("-DX",)
    assert kres.defines() == ("-DX",)
    wrap.lookup_carveout, wrap.commit_carveout, wrap.shared = 0, 100, 64 * 1152
    lookup, commit = _Fn(), _Fn()
    kres.launch(lookup, (1,), (1024,), (), 5000)
    kres.launch_dependent(commit, (1,), (512,), (), 0)
    assert calls == [("lookup", 5000), ("commit", 64 * 1152)]
    assert lookup.preferred_shared_memory_carveout == 0
    assert commit.preferred_shared_memory_carveout == 100
    assert commit.max_dynamic_shared_size_bytes == 64 * 1152  # opted in past 48 KB
    assert lookup.max_dynamic_shared_size_bytes == 48 * 1024
    wrap.end_variant()  # the opt-in undone: the next variant gets the kernel as loaded
    assert commit.max_dynamic_shared_size_bytes == 48 * 1024
    wrap.shared = None  # the wrapper's own
    kres.launch_dependent(commit, (1,), (512,), (), 123)
    assert calls[-1] == ("commit", 123)
    launch = kres.launch
    wrap.restore()
    assert kres.launch is not launch and kres.defines() == ()


def test_differences_pair_each_variant_with_the_base_of_its_own_round() -> None:
    rec = {"results": [
        {"round": 0, "batch": 1, "profile": "hit100", "variant": "plain", "us": 10.0},
        {"round": 0, "batch": 1, "profile": "hit100", "variant": "tma", "us": 12.0},
        {"round": 1, "batch": 1, "profile": "hit100", "variant": "plain", "us": 20.0},
        {"round": 1, "batch": 1, "profile": "hit100", "variant": "tma", "us": 21.0},
        {"round": 1, "batch": 32, "profile": "miss20", "variant": "tma", "us": 5.0},  # no base
    ]}
    assert differences(rec) == {"tma": {(1, "hit100"): 1.5}}
    md = differences_md(rec).splitlines()
    assert md[0] == "| variant (µs against plain) | hit100, batch 1 | miss20, batch 32 |"
    assert md[2] == "| tma | +1.5 | - |"


def test_the_summary_of_a_committed_run_is_the_readme_s_table() -> None:
    with open(Path(__file__).parents[2] / "bench/results/tma_cost_eff1103.json") as f:
        diffs = differences(json.load(f))
    # bench/README.md "Runs 58-65", run 60
    assert round(diffs["tma"][(1, "hit100")], 1) == 1.2
    assert round(diffs["tma_inline"][(32, "hit100")], 1) == 1.5
    assert round(diffs["plain_copy_noinline"][(160, "miss20")], 1) == 156.9


def test_interleaved_calls_take_turns_and_back_to_back_calls_do_not() -> None:
    assert schedule(["a", "b"], 3, True) == [("a", 0), ("b", 0), ("a", 1), ("b", 1),
                                              ("a", 2), ("b", 2)]
    assert schedule(["a", "b"], 2, False) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    for interleave in (True, False):  # every variant's reps, each once
        calls = schedule(["a", "b", "c"], 4, interleave)
        assert sorted(calls) == [(n, r) for n in "abc" for r in range(4)]


def test_copy_floor_variants_launch_the_rules_they_name() -> None:
    """auto_wave is run 113's rule, auto_one_per_sm the rule before run 114; on 132 SMs both
    leave batch 32's 136 copy blocks, and at batch 160 104 and 132 (the default takes 104)."""
    from kernels.resolver_settings import launched_copy_blocks

    floors = {n: v.copy_floor for n, v in VARIANTS.items() if v.copy_floor}
    assert floors == {"auto_wave": "48", "auto_one_per_sm": "sms"}
    wave, one = floored_copy_blocks("48"), floored_copy_blocks("sms")
    assert [wave(c, 132) for c in (128, 160, 256)] == [136, 104, 48]
    assert [one(c, 132) for c in (128, 160, 256)] == [136, 132, 132]
    assert launched_copy_blocks(160, 132) == wave(160, 132)


def test_the_smid_table_is_as_long_as_the_kernels_and_its_stats_count_blocks_per_sm() -> None:
    from bench.resolver.tma_cost import DIAG_SMID_MAX, smid_stats

    src = source("resolver")
    assert re.search(rf"#define DIAG_SMID_MAX {DIAG_SMID_MAX}\b", src)
    table = types.SimpleNamespace(get=lambda: [5, 7, 5, -1, 9, -1])
    assert smid_stats(table) == {"blocks": 4, "sms": 3, "most_on_one_sm": 2}
    assert smid_stats(types.SimpleNamespace(get=lambda: [-1] * 3)) == {
        "blocks": 0, "sms": 0, "most_on_one_sm": 0}
    assert re.search(r"__device__ int diag_smid\[DIAG_SMID_MAX\]", src)
    assert {n for n, v in VARIANTS.items() if not v.pdl} >= {"auto_nopdl", "auto_nopdl_smid"}


def test_a_variant_goes_out_under_its_own_pdl_and_lookup_shape_and_the_run_s_after(
        monkeypatch) -> None:
    from bench.resolver.tma_cost import variant_env

    monkeypatch.setenv("DHISPARSE_PDL", "1")
    monkeypatch.setenv("DHISPARSE_LOOKUP_BLOCKS", "2")
    variant_env(VARIANTS["auto_nopdl"], "2", "1")
    assert os.environ["DHISPARSE_PDL"] == "0" and os.environ["DHISPARSE_LOOKUP_BLOCKS"] == "2"
    variant_env(VARIANTS["auto_lookup1"], "2", "1")  # PDL as the run found it again
    assert os.environ["DHISPARSE_PDL"] == "1" and os.environ["DHISPARSE_LOOKUP_BLOCKS"] == "1"
    variant_env(VARIANTS["auto"], None, None)  # both unset where the run found them unset
    assert "DHISPARSE_PDL" not in os.environ and "DHISPARSE_LOOKUP_BLOCKS" not in os.environ


def test_the_smid_table_is_read_from_the_module_the_commit_was_built_in(monkeypatch) -> None:
    import sys

    from bench.resolver.tma_cost import DIAG_SMID_MAX, SMID, smid_table
    from kernels import _loader

    asked = []

    class _Module:
        def get_global(self, name: str) -> str:
            asked.append(name)
            return "pointer"

    fake = types.SimpleNamespace(
        int32="int32", ndarray=lambda shape, dtype, memptr: (shape, dtype, memptr))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(_loader, "module", lambda *key: asked.append(key) or _Module())
    kres = types.SimpleNamespace(defines=lambda: ("-DRESOLVER_TRACE",), launch=None,
                                 launch_dependent=None)
    wrap = Launches(kres)
    wrap.flags = (SMID,)  # as a *_smid variant's calls: the commit's defines() are these
    assert smid_table(kres, 3) == ((DIAG_SMID_MAX,), "int32", "pointer")
    assert asked == [("resolver", 3, ("-DRESOLVER_TRACE", SMID)), "diag_smid"]
