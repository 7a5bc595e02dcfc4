"""``kernels.resolver_round``: when a round goes out as one launch, and the single launch's
argument block against resolve_fused's parameter list (CPU: the launch is captured)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from kernels._loader import source
from services.common.errors import InvalidArgument

CTYPES = {"i64": np.int64, "int": np.int32, "unsigned": np.uint32}


def fused_params() -> list[tuple[str, type]]:
    """(name, numpy type of the value passed) of each FUSED_ARGS parameter, in order."""
    text = source("resolver")
    macro = text[text.index("#define FUSED_ARGS"):]
    macro = macro[:macro.index("\n\n")].replace("\\\n", " ").split(None, 2)[2]
    out = []
    for decl in macro.split(","):
        words = decl.replace("*", " * ").split()
        kind = np.uint64 if "*" in words else CTYPES[words[-2]]
        out.append((words[-1], kind))
    return out


def test_one_launch_setting_is_validated(monkeypatch) -> None:
    from kernels.resolver_settings import one_launch_enabled

    monkeypatch.delenv("DHISPARSE_ONE_LAUNCH", raising=False)
    assert one_launch_enabled()
    monkeypatch.setenv("DHISPARSE_ONE_LAUNCH", "0")
    assert not one_launch_enabled()
    monkeypatch.setenv("DHISPARSE_ONE_LAUNCH", "on")
    with pytest.raises(InvalidArgument, match="DHISPARSE_ONE_LAUNCH='on' must be 0 or 1"):
        one_launch_enabled()


def test_one_launch_grid_leaves_sms_to_the_copies_or_declines() -> None:
    from kernels.resolver_round import ONE_LAUNCH_COPY_BLOCKS_MIN, one_launch_grid

    assert one_launch_grid(1, 1, 132) == 132  # 1 request block, 131 copy blocks
    assert one_launch_grid(132 - ONE_LAUNCH_COPY_BLOCKS_MIN, 2, 132) == 132
    assert one_launch_grid(133 - ONE_LAUNCH_COPY_BLOCKS_MIN, 1, 132) == 0  # two launches
    assert one_launch_grid(160, 1, 132) == 0
    assert one_launch_grid(40, 0, 132) == 40  # no layers to copy: request blocks only


class _Fn:  # what kernels.resolver_round reads of a compiled function
    shared_size_bytes = 26224


@pytest.fixture
def captured(monkeypatch) -> dict:
    """resolve_round on CPU tensors with the device checks, the compile and the launch
    replaced: the launch's grid, block, shared bytes and arguments are recorded."""
    from kernels import _loader as ld
    from kernels import resolver as kres
    from kernels import resolver_round as rr

    real_check = ld.check
    monkeypatch.setattr(kres, "check", lambda n, t, d, k, where: real_check(n, t, d, k, "any"))
    monkeypatch.setattr(kres, "lookup_blocks", lambda batch, dev: 1)
    monkeypatch.setattr(rr, "sm_count", lambda dev: 132)
    monkeypatch.setattr(rr, "cooperative_launch_available", lambda: True)
    monkeypatch.setattr(rr, "kernel", lambda *a: _Fn())
    monkeypatch.setattr(rr, "dynamic_shared_cap", lambda fn, dev: 227 * 1024 - 26224)
    got: dict = {}

    def fake_launch(fn, grid, block, args, shared=0) -> None:
        got.update(grid=grid, block=block, args=args, shared=shared)

    monkeypatch.setattr(rr, "launch_cooperative", fake_launch)
    return got


def test_single_launch_passes_arguments_in_the_kernels_order(captured) -> None:
    from kernels import resolver as kres
    from kernels.resolver_round import resolve_round

    batch, K, k, B = 3, 2, 5, 7
    i64 = dict(dtype=torch.int64)
    ws = kres.Workspace.new(batch, K * k, B, torch.device("cpu"))
    table = torch.zeros(batch, kres.T_COLS, **i64)
    sel = torch.zeros(batch, K, k, **i64)
    vis = torch.zeros(batch, K, **i64)
    locs = torch.zeros(batch, K, k, **i64)
    stage = torch.zeros(11, **i64)
    out = kres.CopyList(*(torch.zeros(batch * K * k, **i64) for _ in range(4)))
    host, pay = torch.zeros(2, batch, **i64), torch.zeros(2, **i64)
    assert resolve_round(ws, table, sel, vis, locs, stage, out, hot_slots=B, tail_rows=9,
                         page_rows=4, rows_bound=1000, finished_epoch=6, epoch=8,
                         host_ptrs=host, payloads=pay, row_bytes=656, copy_blocks=5,
                         select="sort", one_launch=True)
    assert captured["grid"] == (132,) and captured["block"] == (kres.LOOKUP_THREADS,)
    words = kres.bitmap_words(1000)
    assert captured["shared"] == 12 * (-(-words // 4) * 4) + 8 * kres.sort_size(B)
    want = dict(
        table=table, sel=sel, visible=vis, locs=locs, need_loc=ws.need_loc, misses=ws.misses,
        victims=ws.victims, hit_mask=ws.hit_mask, summary=ws.summary, totals=ws.totals,
        batch=batch, K=K, k=k, B=B, Bp=kres.sort_size(B), T=9, p=4, words=words,
        finished_epoch=6, select_mode=kres.VICTIM_SELECT["sort"], stage_locs=stage,
        n_stage_locs=11, copy_batch=out.batch, copy_rows=out.rows, copy_dst=out.dst,
        staged_rows=out.staged_rows, host_ptrs=host, payload_ptrs=pay, n_layers=2,
        row_bytes=656, epoch=8, copy_blocks=5)
    params = fused_params()
    assert [n for n, _ in params] == list(want)
    args = captured["args"]
    assert len(args) == len(params)
    for (name, kind), value in zip(params, args, strict=True):
        assert type(value) is kind, (name, type(value), kind)
        expect = want[name]
        expect = expect.data_ptr() if isinstance(expect, torch.Tensor) else expect
        assert int(value) == expect, name


def test_single_launch_refuses_bad_copy_blocks_before_launching(captured) -> None:
    from kernels import resolver as kres
    from kernels.resolver_round import resolve_round

    ws = kres.Workspace.new(1, 4, 2, torch.device("cpu"))
    z = torch.zeros(1, 1, 4, dtype=torch.int64)
    out = kres.CopyList(*(torch.zeros(4, dtype=torch.int64) for _ in range(4)))
    with pytest.raises(InvalidArgument, match=r"copy_blocks=-1 must be in \[0, 65536\]"):
        resolve_round(ws, torch.zeros(1, 9, dtype=torch.int64), z, z[:, :, 0], z.clone(),
                      torch.zeros(4, dtype=torch.int64), out, hot_slots=2, tail_rows=4,
                      page_rows=4, rows_bound=8, finished_epoch=0, epoch=1, copy_blocks=-1)
    assert captured == {}


def test_the_fused_kernels_meet_at_a_grid_barrier_between_lookup_and_commit() -> None:
    text = source("resolver")
    body = text[text.index("void fused_body("):text.index("#define FUSED(W)")]
    order = [body.index(m) for m in ("lookup_body<4>(", "grid_barrier(", "commit_body<W>(")]
    assert order == sorted(order)
    # the commit sums the batch itself (sums_here = 1) with one part per request
    assert re.search(r"copy_blocks,\s*1,\s*1\);", body)
    for w in (16, 8, 4):
        assert f"FUSED({w})" in text
