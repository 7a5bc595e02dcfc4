"""``kernels._loader.source``: the NVRTC text of each module (CPU; no CUDA needed)."""

from __future__ import annotations

import re

import pytest

from kernels._loader import HERE, SOURCES, source


def test_a_single_file_module_is_its_file() -> None:
    assert source("copy") == "\n".join((HERE / "copy.cu").read_text().splitlines()) + "\n"


def test_the_resolver_parts_join_into_one_source_with_every_kernel_the_wrappers_launch() -> None:
    text = source("resolver")
    wrappers = (HERE / "resolver.py").read_text() + (HERE / "promote.py").read_text()
    # launched by name from resolver.py: func + "_rank" + q, func + q (LOOKUP_KERNELS(Q, ...)
    # defines resolve_lookup{,_2}{,_rank}##Q)
    for name in ("resolve_lookup", "resolve_lookup_2"):
        assert f'"{name}' in wrappers
    for form in ("", "_2", "_rank", "_2_rank"):
        assert re.search(rf"__global__ void __launch_bounds__\([^)]*\) resolve_lookup{form}##Q\(",
                         text), form
    assert "LOOKUP_KERNELS(, false)" in text and "LOOKUP_KERNELS(_q, true)" in text
    assert 'func + "_rank" + q' in wrappers and "func + q" in wrappers
    for width in (16, 8, 4):  # resolve_commit_<w>, plan_copy_<w>, promote_staged_<w>
        assert f"COMMIT(resolve_commit_{width}, {width}, false)" in text
        assert f"PLAN_COPY({width})" in text and f"PROMOTE({width})" in text
    assert "COMMIT(resolve_commit_16_tma, 16, true)" in text  # f"resolve_commit_{w}_tma"
    assert "resolve_commit_{w}{'_tma' if tma_kernel else ''}" in wrappers
    assert '"promote_staged_' in wrappers
    # one translation unit: the header once, no include of a sibling part left
    assert text.count("#define DHISPARSE_RESOLVER_COMMON_CUH") == 1
    assert text.count("#define DHISPARSE_RESOLVER_SORT_CUH") == 1
    assert text.count("#define DHISPARSE_RESOLVER_COPY_CUH") == 1
    assert text.count("#define DHISPARSE_RESOLVER_VICTIMS_CUH") == 1
    assert not re.search(r'#\s*include\s+"resolver_', text)
    # in order: the header's definitions precede their users
    marks = ("enum { T_HOT_ROWS", "bool sort_registers", "void bulk_load", "void copy_misses",
             "MissPath miss_path", "void lookup_body", "commit_body", "promote_body")
    assert [text.index(m) for m in marks] == sorted(text.index(m) for m in marks)
    for part in SOURCES["resolver"]:
        assert (HERE / part).exists(), part


def test_the_tma_row_buffers_the_host_sizes_are_the_ones_the_kernel_indexes() -> None:
    """resolver_settings.TMA_ROWS (the dynamic shared memory commit launches with, in rows)
    is resolver_tma.cuh's TMA_WARPS x TMA_STAGES: fewer, and the bulk copies would write
    past the block's shared memory."""
    from kernels.resolver_settings import TMA_ROWS

    text = (HERE / "resolver_tma.cuh").read_text()
    value = {m.group(1): int(m.group(2))
             for m in re.finditer(r"#define (TMA_\w+) (\d+)", text)}
    assert value["TMA_WARPS"] * value["TMA_STAGES"] == TMA_ROWS
    assert "#define TMA_ROWS (TMA_WARPS * TMA_STAGES)" in text
    assert value["TMA_DEPTH"] <= value["TMA_STAGES"]


def test_workspace_pointers_follow_the_kernels_argument_order() -> None:
    """Both launches take miss_dst, misses, victims, hit_mask, summary, totals in this
    order right after their own leading arguments (resolver_lookup.cu / _commit.cu)."""
    import torch

    from kernels.resolver import Workspace

    ws = Workspace.new(2, 4, 3, torch.device("cpu"))
    order = (ws.miss_dst, ws.misses, ws.victims, ws.hit_mask, ws.summary, ws.totals)
    assert [int(p) for p in ws.pointers()] == [t.data_ptr() for t in order]
    text = source("resolver")
    macro = text[text.index("#define LOOKUP_PASS"):].split("\n")[0:2]
    names = [n.strip(" \\") for n in " ".join(macro).split()[2:]]
    names = [n.rstrip(",") for n in names if n.rstrip(",")]
    assert names[4:10] == ["miss_dst", "misses", "victims", "hit_mask", "summary", "totals"]


def test_promote_passes_arguments_in_the_kernels_order() -> None:
    """kernels.promote.promote's argument tuple against promote_staged's parameter list."""
    import inspect

    from kernels import promote

    text = source("resolver")
    sig = text[text.index("void __launch_bounds__(NT) promote_staged_"):]
    params = re.findall(r"(\w+)\s*[,)]", sig[sig.index("(", sig.index("promote_staged_")):
                                            sig.index("{")])
    body = inspect.getsource(promote.promote)
    args = body[body.index("args = ("):body.index("launch(")]
    passed = re.findall(r"(?:ptr|np\.\w+)\(([\w.]+?)(?:\.numel\(\))?\)", args)
    # the same 14 values in the same order on both sides (n_layers = payload_ptrs.numel())
    assert passed == ["table", "rows", "locs", "offsets", "epochs", "slot_of", "promoted",
                      "payload_ptrs", "payload_ptrs", "row_bytes", "hot_slots", "pow2", "words",
                      "finished_epoch"]
    assert params == ["table", "rows", "locs", "off", "epochs", "slot_of", "promoted",
                      "payload_ptrs", "n_layers", "row_bytes", "B", "Bp", "words",
                      "finished_epoch"]


def _enum_values(text: str, first: str) -> dict[str, int]:
    """The names and values of the C enum whose first member is ``first``."""
    text = re.sub(r"//[^\n]*", "", text)
    body = re.search(rf"enum \{{\s*({first}\b[^}}]*)\}}", text).group(1)
    values, nxt = {}, 0
    for item in (i.strip() for i in body.split(",") if i.strip()):
        name, _, expr = (p.strip() for p in item.partition("="))
        if expr:  # "N" (decimal or hex) or "NAME + N", the forms the header uses
            base, _, add = (p.strip() for p in expr.partition("+"))
            nxt = (values[base] if base in values else int(base, 0)) + int(add or "0", 0)
        values[name], nxt = nxt, nxt + 1
    return values


def test_enum_values_reads_the_headers_forms() -> None:
    text = "enum { A, B = 0x10, C, // a comment, with a comma\n D = B + 4, E };"
    assert _enum_values(text, "A") == {"A": 0, "B": 16, "C": 17, "D": 20, "E": 21}


def test_the_wrappers_constants_are_the_headers() -> None:
    """kernels.resolver (and request.py) mirror resolver_common.cuh's table, summary and
    totals columns, status bits and the hot_rank header: a column added to or moved in a C
    enum and not here makes every workspace the wrong size or reads the wrong column."""
    from kernels import resolver as kres
    from services.decode.hierarchy import request

    text = (HERE / "resolver_common.cuh").read_text()
    table = _enum_values(text, "T_HOT_ROWS")
    assert [n.removeprefix("T_").lower() for n in table if n != "TCOLS"] == list(
        kres.TABLE_COLUMNS)
    summary, totals = _enum_values(text, "S_STATUS"), _enum_values(text, "R_STATUS")
    assert (kres.T_COLS, kres.S_COLS, kres.TOT_COLS) == (
        table["TCOLS"], summary["SCOLS"], totals["TOT_COLS"])
    for name in ("S_U", "S_M", "S_NV"):
        assert getattr(kres, name) == summary[name], name
    for name in ("R_STATUS", "R_COPIES", "R_STAGED", "R_TAIL", "R_OPT", "R_HOT", "R_HOST",
                 "R_DIRECT", "R_PEND", "R_PRELOADS"):
        assert getattr(kres, name) == totals[name], name
    st = _enum_values(text, "ST_SEL_LT_M1")
    assert kres.ST_SELECTION == (st["ST_SEL_LT_M1"] | st["ST_VISIBLE"]
                                 | st["ST_SEL_GE_VISIBLE"] | st["ST_ROW_RANGE"])
    assert (kres.ST_NOT_RESIDENT, kres.ST_STAGING) == (st["ST_NOT_RESIDENT"], st["ST_STAGING"])
    rank = _enum_values(text, "RANK_VERSION")
    for name in ("RANK_VERSION", "RANK_BUILT", "RANK_WORDS", "RANK_HEAD"):
        assert getattr(request, name) == rank[name], name
    bits = int(re.search(r"#define HOT_SLOT_BITS (\d+)", text).group(1))
    mask = int(re.search(r"#define HOT_SLOT_MASK (0x[0-9A-Fa-f]+)ll", text).group(1), 16)
    assert request.HOT_SLOT_BITS == bits and mask == (1 << bits) - 1


def test_a_table_row_takes_every_column_by_name_in_the_kernels_order() -> None:
    from types import SimpleNamespace

    import torch

    from kernels import dropin
    from kernels import resolver as kres
    from services.decode.hierarchy.request import rank_words

    cols = {c: 100 + i for i, c in enumerate(kres.TABLE_COLUMNS)}
    assert kres.table_row(**cols) == [cols[c] for c in kres.TABLE_COLUMNS]
    with pytest.raises(TypeError, match=r"missing \['tail_hi'\], unknown \['tail_high'\]"):
        kres.table_row(**{**{c: 0 for c in kres.TABLE_COLUMNS if c != "tail_hi"},
                          "tail_high": 0})
    t = {c: torch.zeros(2, dtype=torch.int64) for c in ("hot_rows", "hot_stamp", "hot_locs",
                                                        "tail_locs", "page_map", "page_ready",
                                                        "hot_index", "hot_rank")}
    state = SimpleNamespace(**t, max_rows=1000, tail_lo=7, tail_hi=9, map_hi=5)
    (row,) = dropin.table_rows([state])
    at = {c: i for i, c in enumerate(kres.TABLE_COLUMNS)}
    for name, tensor in t.items():
        assert row[at[name]] == tensor.data_ptr(), name
    assert (row[at["tail_lo"]], row[at["tail_hi"]], row[at["map_hi"]]) == (7, 9, 5)
    assert row[at["rank_cap"]] == rank_words(1000)
