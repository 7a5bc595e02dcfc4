"""``kernels._loader.source``: the NVRTC text of each module (CPU; no CUDA needed)."""

from __future__ import annotations

import re

from kernels._loader import HERE, SOURCES, source


def test_a_single_file_module_is_its_file() -> None:
    assert source("copy") == "\n".join((HERE / "copy.cu").read_text().splitlines()) + "\n"


def test_the_resolver_parts_join_into_one_source_with_every_kernel_the_wrappers_launch() -> None:
    text = source("resolver")
    wrappers = (HERE / "resolver.py").read_text()
    for name in ("resolve_lookup", "resolve_lookup_2"):  # launched by name from resolver.py
        assert re.search(rf"__global__ void (__launch_bounds__\([^)]*\) )?{name}\(", text)
        assert f'"{name}' in wrappers
    for width in (16, 8, 4):  # resolve_commit_<w>, plan_copy_<w>
        assert f"COMMIT({width})" in text and f"PLAN_COPY({width})" in text
    # one translation unit: the header once, no include of a sibling part left
    assert text.count("#define DHISPARSE_RESOLVER_COMMON_CUH") == 1
    assert not re.search(r'#\s*include\s+"resolver_', text)
    # in order: the header's definitions precede their users
    assert text.index("enum { T_HOT_ROWS") < text.index("lookup_body") < text.index("commit_body")
    for part in SOURCES["resolver"]:
        assert (HERE / part).exists(), part


def test_workspace_pointers_follow_the_kernels_argument_order() -> None:
    """Both launches take need_loc, misses, victims, hit_slots, summary, totals in this
    order right after their own leading arguments (resolver_lookup.cu / _commit.cu)."""
    import torch

    from kernels.resolver import Workspace

    ws = Workspace.new(2, 4, 3, torch.device("cpu"))
    order = (ws.need_loc, ws.misses, ws.victims, ws.hit_slots, ws.summary, ws.totals)
    assert [int(p) for p in ws.pointers()] == [t.data_ptr() for t in order]
    text = source("resolver")
    macro = text[text.index("#define LOOKUP_PASS"):].split("\n")[0:2]
    names = [n.strip(" \\") for n in " ".join(macro).split()[2:]]
    names = [n.rstrip(",") for n in names if n.rstrip(",")]
    assert names[4:10] == ["need_loc", "misses", "victims", "hit_slots", "summary", "totals"]
