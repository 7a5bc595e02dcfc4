"""The fused CUDA resolver's refusals: bad arguments are named before anything reaches the
device, and every error the kernels flag (bad selections, an exhausted staging arena, rows
without a hot cache, copy layers out of range) raises what the torch reference raises,
with the group unchanged."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import InvalidArgument, ResourceExhausted
from services.decode import hierarchy as ref
from tests.hierarchy.harness import Harness, assert_same, snapshot
from tests.kernels.test_fused_resolver import check_round, make_pair, run_both, selections


@pytest.mark.gpu
def test_rows_without_a_hot_cache_raise_like_the_reference_and_change_nothing() -> None:
    """policy resident has no hot cache (B = 0): a row neither in the tail nor on a ready
    page has nowhere to go. The kernels flag it and the drop-in names the request."""
    from kernels import dropin

    pair = [Harness("cuda", policy="resident", layers=1) for _ in range(2)]
    for h in pair:
        h.admit("a", 32, 16)
        h.admit("b", 32, 16)
        h.open("a", 1)
        h.open("b", 1)
        h.group.request("b").page_ready[0] = False  # as if its copy had not completed
    sel = pair[0].tensor([[[3, 16]], [[1, 16]]])
    bounds = pair[0].causal_bounds(["a", "b"], 1)
    with pytest.raises(RuntimeError, match="request_id='b': rows \\[1\\] not resident"):
        ref.resolve(pair[0].group, ["a", "b"], sel, bounds)
    before = snapshot(pair[1])
    with pytest.raises(RuntimeError, match="request_id='b': rows needing the hot cache are not"):
        dropin.resolve(pair[1].group, ["a", "b"], sel, bounds)
    assert_same(before, snapshot(pair[1]))


def test_lookup_validates_shapes_before_launch() -> None:
    from kernels import resolver as kres

    ws = kres.Workspace.new(1, 4, 2, torch.device("cpu"))
    sel = torch.zeros(1, 1, 4, dtype=torch.int64)
    with pytest.raises(InvalidArgument, match="table is on device=cpu"):
        kres.lookup(
            ws,
            torch.zeros(1, kres.T_COLS, dtype=torch.int64),
            sel,
            sel[:, :, 0],
            sel,
            hot_slots=2,
            tail_rows=4,
            page_rows=4,
            rows_bound=8,
            finished_epoch=0,
        )


def _lookup_args(batch: int, ws_batch: int, **kw) -> tuple[tuple, dict]:
    from kernels import resolver as kres

    ws = kres.Workspace.new(ws_batch, 4, 2, torch.device("cpu"))
    sel = torch.zeros(batch, 2, 2, dtype=torch.int64)
    table = torch.zeros(batch, kres.T_COLS, dtype=torch.int64)
    args = (ws, table, sel, sel[:, :, 0].contiguous(), sel.clone())
    opts = dict(hot_slots=2, tail_rows=4, page_rows=4, rows_bound=8, finished_epoch=0) | kw
    return args, opts


@pytest.mark.parametrize(("batch", "kw", "message"), [
    (1, dict(select="bogus"), r"select='bogus' must be one of \['radix', 'radix_match', 'sort'\]"),
    (1, dict(page_rows=0), r"page_rows=0 is below the minimum 1"),
    (1, dict(tail_rows=2**31), r"tail_rows=2147483648 exceeds the kernel limit"),
    (1, dict(hot_slots=-1), r"hot_slots=-1 is below the minimum 0"),
    (2, {}, r"ws.miss_dst holds 4 values; batch=2, K\*k=4, hot_slots=2 need 8"),
])
def test_lookup_refuses_bad_arguments_before_touching_the_device(batch, kw, message) -> None:
    from kernels import resolver as kres

    args, opts = _lookup_args(batch, 1, **kw)
    with pytest.raises(InvalidArgument, match=message):
        kres.lookup(*args, **opts)


def test_commit_checks_the_round_like_lookup() -> None:
    from kernels import resolver as kres

    (ws, table, sel, _, locs), _ = _lookup_args(1, 1)
    out = kres.CopyList(*(torch.zeros(4, dtype=torch.int64) for _ in range(4)))
    stage = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(InvalidArgument, match=r"locations \(1, 1, 2\) must be"):
        kres.commit(ws, table, sel, locs[:, :1], stage, out, epoch=1, hot_slots=2)
    with pytest.raises(InvalidArgument, match="table is on device=cpu"):
        kres.commit(ws, table, sel, locs, stage, out, epoch=1, hot_slots=2)


def test_lookup_shared_memory_formula_and_long_histories_fit_an_sm() -> None:
    """Miss bitmap (u32) + its prefix (u16) in 16-byte groups, hit bitmap over the sorted
    slots, LRU keys: 100K-row requests with B = 4096 take 52 KB (two blocks fit an SM);
    a million-row history still fits the H200's 227 KB opt-in less the static shared memory
    (ptxas -v: 1280 bytes since the victims are listed in slot order; checked against the 9472
    bytes of before, which bound it)."""
    from kernels.resolver import bitmap_words, lookup_shared_bytes, sort_size

    assert lookup_shared_bytes(3125, 4096) == 6 * 3128 + 4096 // 8 + 8 * 4096 == 52_048
    assert lookup_shared_bytes(1, sort_size(5000)) == 6 * 4 + 8192 // 8 + 8 * 8192
    cap = 227 * 1024 - 9472
    assert lookup_shared_bytes(bitmap_words(1_000_000), sort_size(4096)) <= cap
    assert 2 * (lookup_shared_bytes(3125, 4096) + 9472) <= 228 * 1024


def test_a_misaligned_row_buffer_is_named_as_such() -> None:
    from kernels._loader import vec_width

    buf = torch.zeros(200, dtype=torch.uint8)
    with pytest.raises(InvalidArgument, match="not 4-byte aligned"):
        vec_width(16, buf[1:161])


# -- GPU: flagged by the kernels ------------------------------------------------------
@pytest.mark.gpu
def test_copy_layers_out_of_range_raise_and_change_nothing() -> None:
    from kernels import dropin

    h_ref, h_k, rids = make_pair(11, 2, 1, 8, 64, 16)
    sel = selections(h_ref, rids, 1, 8, 0.0, torch.Generator().manual_seed(11))
    vis = h_k.causal_bounds(rids, 1)
    before = snapshot(h_k)
    for bad in ((2,), (0, 0), (0, 1, 0, 1, 0)):
        with pytest.raises(InvalidArgument, match="layer"):
            dropin.resolve(h_k.group, rids, sel, vis, copy_layers=bad)
        assert_same(before, snapshot(h_k))


@pytest.mark.gpu
def test_bad_selection_raises_like_reference_and_changes_nothing() -> None:
    h_ref, h_k, rids = make_pair(3, 2, 2, 8, 64, 16)
    sel = selections(h_ref, rids, 2, 8, 0.0, torch.Generator().manual_seed(3))
    sel[1, 1, 3] = 10_000  # beyond the query's visible rows
    assert check_round(h_ref, h_k, rids, sel) is None
    sel[1, 1, 3] = -5
    assert check_round(h_ref, h_k, rids, sel) is None


@pytest.mark.gpu
def test_staging_exhaustion_raises_like_reference() -> None:
    h_ref, h_k, rids = make_pair(5, 3, 4, 4, 8, 16)
    sel = selections(h_ref, rids, 4, 32, 0.0, torch.Generator().manual_seed(5))
    p_ref, p_k = run_both(h_ref, h_k, rids, sel)
    assert isinstance(p_ref, ResourceExhausted) and isinstance(p_k, ResourceExhausted)
    assert str(p_ref) == str(p_k)
    assert_same(snapshot(h_ref), snapshot(h_k))
