"""bench/resolver/tma_cost.py on the CPU: its diagnostic builds exist in the resolver's
source, and its launch wrapper sets what each variant says on the right launch."""

from __future__ import annotations

import re
import types

from bench.resolver.tma_cost import VARIANTS, Launches
from kernels._loader import source


def test_every_diagnostic_build_names_a_switch_of_the_resolver_source() -> None:
    src = source("resolver")
    flags = {f for v in VARIANTS.values() for f in v[4]}
    assert flags  # the probe has diagnostic builds to check
    for flag in flags:
        name = flag.removeprefix("-D")
        assert re.search(rf"#\s*if(n?def)?\s+{name}\b", src), f"{name}: not in the source"


class _Fn:
    def __init__(self) -> None:
        self.preferred_shared_memory_carveout = -1
        self.max_dynamic_shared_size_bytes = 48 * 1024


def test_the_wrapper_sets_carveouts_apart_and_the_commits_shared_memory_only() -> None:
    calls = []
    kres = types.SimpleNamespace(
        launch=lambda fn, grid, block, args, shared=0: calls.append(("lookup", shared)),
        launch_dependent=lambda fn, grid, block, args, shared=0: calls.append(("commit", shared)),
    )
    wrap = Launches(kres)
    wrap.lookup_carveout, wrap.commit_carveout, wrap.shared = 0, 100, 64 * 1152
    lookup, commit = _Fn(), _Fn()
    kres.launch(lookup, (1,), (1024,), (), 5000)
    kres.launch_dependent(commit, (1,), (512,), (), 0)
    assert calls == [("lookup", 5000), ("commit", 64 * 1152)]
    assert lookup.preferred_shared_memory_carveout == 0
    assert commit.preferred_shared_memory_carveout == 100
    assert commit.max_dynamic_shared_size_bytes == 64 * 1152  # opted in past 48 KB
    assert lookup.max_dynamic_shared_size_bytes == 48 * 1024
    wrap.shared = None  # the wrapper's own
    kres.launch_dependent(commit, (1,), (512,), (), 123)
    assert calls[-1] == ("commit", 123)
