"""Bad input: the error names the argument, the value and the limit; nothing changes."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from services.decode.hierarchy import (
    HierarchyConfig,
    SourceGroup,
    SourceSpec,
    admit,
    apply_copies,
    backup,
    commit_rows,
    open_rows,
    populate,
    release,
    resolve,
    retire,
)
from tests.hierarchy.harness import Harness, assert_same, snapshot


@pytest.fixture
def h(device: str) -> Harness:
    """Request "a": rows 0-7 optional pages (unbacked), 8-9 tail, rows 10-11 opened."""
    h = Harness(device, policy="adaptive")
    h.admit("a", 32, 10)
    h.open("a", 2)
    h.resolve(["a"], [[[0, 9, 10], [1, 10, 11]]])
    h.check()
    return h


def _t(h: Harness, data, dtype=torch.int64) -> torch.Tensor:
    return torch.tensor(data, dtype=dtype, device=h.group.device)


def expect(h: Harness, exc: type[Exception], pattern: str, fn, *args, **kwargs) -> None:
    before = snapshot(h)
    with pytest.raises(exc, match=pattern):
        fn(*args, **kwargs)
    assert_same(before, snapshot(h))
    h.check()


def test_selection_beyond_its_query_causal_bound(h: Harness) -> None:
    # query 0 sits at row 10 and sees rows < 11; row 11 is visible only to query 1
    expect(h, InvalidArgument, r"selections\[0, 0, 1\]=11 must be < visible\[0, 0\]=11",
           resolve, h.group, ["a"], _t(h, [[[0, 11], [11, 2]]]), _t(h, [[11, 12]]))


def test_visible_beyond_opened_rows(h: Harness) -> None:
    expect(h, InvalidArgument, r"visible\[0, 1\]=13 outside \[0, 12\]",
           resolve, h.group, ["a"], _t(h, [[[0], [1]]]), _t(h, [[11, 13]]))


def test_selection_below_padding(h: Harness) -> None:
    expect(h, InvalidArgument, r"selections\[0, 0, 1\]=-2 must be >= -1",
           resolve, h.group, ["a"], _t(h, [[[0, -2]]]), _t(h, [[11]]))


def test_selection_dtype_and_rank(h: Harness) -> None:
    expect(h, InvalidArgument, r"selections has dtype=torch.int32 .* expected int64",
           resolve, h.group, ["a"], _t(h, [[[0]]], torch.int32), _t(h, [[11]]))
    expect(h, InvalidArgument, r"selections has .*shape=\(1, 1\).* 3 dims",
           resolve, h.group, ["a"], _t(h, [[0]]), _t(h, [[11]]))
    expect(h, InvalidArgument, r"visible has shape=\(1, 2\); expected \(batch, K\)=\(1, 1\)",
           resolve, h.group, ["a"], _t(h, [[[0]]]), _t(h, [[11, 12]]))


def test_selection_on_the_wrong_device(h: Harness) -> None:
    meta = torch.zeros(1, 1, 1, dtype=torch.int64, device="meta")
    expect(h, InvalidArgument, r"selections is on device=meta; expected",
           resolve, h.group, ["a"], meta, _t(h, [[11]]))


def test_unknown_and_duplicate_requests(h: Harness) -> None:
    expect(h, NotFound, r"request_id='zz' is not admitted",
           resolve, h.group, ["zz"], _t(h, [[[0]]]), _t(h, [[1]]))
    expect(h, InvalidArgument, r"request_ids=\['a', 'a'\] must be 2 distinct ids",
           resolve, h.group, ["a", "a"], _t(h, [[[0]], [[0]]]), _t(h, [[11], [11]]))
    for op in (backup, retire, release):
        expect(h, NotFound, "request_id='zz'", op, h.group, "zz")
    expect(h, NotFound, "request_id='zz'", open_rows, h.group, "zz", 1)


def test_unknown_payload_layer(h: Harness) -> None:
    plan = h.resolve(["a"], [[[0]]])
    expect(h, InvalidArgument, r"layer=2 outside payload layers \[0, 2\)",
           apply_copies, h.group, plan, 2)
    with pytest.raises(InvalidArgument, match="layer=-1"):
        h.group.payload(-1)
    with pytest.raises(InvalidArgument, match="layer=True"):  # a bool is no layer number
        h.group.payload(True)


def test_retire_without_backup_is_failed_precondition(h: Harness) -> None:
    h.group.readers_finished()
    expect(h, FailedPrecondition, r"page=0 \(rows \[0, 4\)\) .* without host backing",
           retire, h.group, "a")
    expect(h, InvalidArgument, r"pages\[0\]=5 is not an optional page .* \[0, 1\]",
           retire, h.group, "a", [5])


def test_retire_refuses_repeated_and_non_integer_pages(h: Harness) -> None:
    h.group.readers_finished()
    backup(h.group, "a")
    h.check()
    expect(h, InvalidArgument, r"pages\[1\]=0 repeats an earlier page", retire, h.group, "a",
           [0, 0])
    for bad in ([0], {}, 0.0, False, True):  # bools are no page numbers (False == 0)
        expect(h, InvalidArgument, r"pages\[0\]=.* is not an optional page", retire, h.group,
               "a", [bad])
    assert retire(h.group, "a", [1, 0]) == 2
    h.check()


def test_open_and_commit_ranges(h: Harness) -> None:
    expect(h, InvalidArgument, r"count=0 must be an integer >= 1", open_rows, h.group, "a", 0)
    expect(h, InvalidArgument, r"count=21 opens rows up to 33 > max_rows=32",
           open_rows, h.group, "a", 21)
    expect(h, InvalidArgument, r"committed=13 outside \[10, 12\]", commit_rows, h.group, "a", 13)
    expect(h, InvalidArgument, r"committed=9 outside \[10, 12\]", commit_rows, h.group, "a", 9)
    expect(h, InvalidArgument, r"committed=True outside", commit_rows, h.group, "a", True)


def test_admit_bad_history_and_duplicates(h: Harness) -> None:
    rows = torch.zeros(4, 8, dtype=torch.uint8)
    expect(h, AlreadyExists, "request_id='a' is already admitted", admit, h.group, "a", 8)
    expect(h, InvalidArgument, r"history has 1 tensors; expected payload_layers=2",
           admit, h.group, "b", 8, [rows])
    expect(h, InvalidArgument, r"history\[1\] has dtype=torch.uint8 shape=\(4, 7\)",
           admit, h.group, "b", 8, [rows, rows[:, :7]])
    expect(h, InvalidArgument, r"history rows=4 exceed max_rows=3",
           admit, h.group, "b", 3, [rows, rows])
    expect(h, InvalidArgument, r"max_rows=0 must be an integer >= 1", admit, h.group, "b", 0)
    for sid in h.group.source_ids:  # a host history that misses row 3
        h.provider.open("c", sid, 8, 8).commit(0, 3)
    expect(h, FailedPrecondition, r"host rows \[0, 4\) of layer=0 are not all backed",
           admit, h.group, "c", 8, None, 4)
    expect(h, InvalidArgument, r"imported_rows=9 exceeds max_rows=8",
           admit, h.group, "c", 8, None, 9)


def test_failed_admission_frees_only_the_histories_it_created(h: Harness) -> None:
    # no host history of "d" exists: the admission opens (creates) them, finds row 0
    # unbacked and must free them again; "c"'s histories (prefill's, re-attached by the
    # failing admission of "c") must stay for a retry. snapshot() covers both.
    for sid in h.group.source_ids:
        h.provider.open("c", sid, 8, 8).commit(0, 3)
    expect(h, FailedPrecondition, r"host rows \[0, 4\) of layer=0 are not all backed",
           admit, h.group, "d", 8, None, 4)
    expect(h, FailedPrecondition, r"host rows \[0, 4\) of layer=0 are not all backed",
           admit, h.group, "c", 8, None, 4)
    assert ("c", h.group.source_ids[0]) in h.provider.histories


def test_admission_failing_while_placing_rows_gives_back_pages_and_histories(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    from services.decode.hierarchy.backing import InProcessBacking

    def broken(self, start, data):
        raise OSError("host write failed")

    monkeypatch.setattr(InProcessBacking, "write", broken)
    rows = torch.ones(12, 8, dtype=torch.uint8)  # with max_optional=0 rows go to the host
    expect(h, OSError, "host write failed", admit, h.group, "e", 16, [rows, rows], 0, 0)


def test_admit_over_capacity_and_slots(device: str) -> None:
    h = Harness(device, policy="hisparse", max_requests=1)
    h.admit("a", 8, 0)
    expect(h, ResourceExhausted, r"requests=1 at max_requests=1", admit, h.group, "b", 8)


def test_populate_and_backup_arguments(h: Harness) -> None:
    expect(h, InvalidArgument, r"max_pages=0 must be an integer >= 1",
           populate, h.group, "a", 0)
    expect(h, InvalidArgument, r"max_pages=0 must be an integer >= 1",
           backup, h.group, "a", 0)


def test_reader_fence_bounds(h: Harness) -> None:
    expect(h, InvalidArgument, r"epoch=7 must lie in \[finished_epoch=0, clock=1\]",
           h.group.readers_finished, 7)


def test_config_and_group_validation() -> None:
    with pytest.raises(InvalidArgument, match=r"tail_rows=3 must be an integer >= 4"):
        HierarchyConfig(num_pages=8, page_rows=4, tail_rows=3)
    with pytest.raises(InvalidArgument, match=r"reserve_pages=8 must be < num_pages=8"):
        HierarchyConfig(num_pages=8, page_rows=4, tail_rows=4, reserve_pages=8)
    with pytest.raises(InvalidArgument, match=r"policy='lru' must be one of"):
        HierarchyConfig(num_pages=8, policy="lru")
    with pytest.raises(InvalidArgument, match=r"provider=None but policy='adaptive'"):
        SourceGroup(SourceSpec("g", 8), HierarchyConfig(num_pages=8, page_rows=4, tail_rows=4))
    with pytest.raises(InvalidArgument, match=r"row_bytes=0 must be an integer >= 1"):
        SourceSpec("g", 0)
