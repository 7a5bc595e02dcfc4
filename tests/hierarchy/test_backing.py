"""``InProcessBacking``: rows nobody wrote read as zeros, although a fresh history is not
zero-filled up front (an imported history is written from row 0 right after open)."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import InvalidArgument
from services.decode.hierarchy.backing import InProcessBacking


def _reused(rows: int = 12, row_bytes: int = 4) -> InProcessBacking:
    b = InProcessBacking(row_bytes, rows)
    b._rows.fill_(0xAB)  # what reused (pinned, cached) memory may hold
    return b


def test_unwritten_rows_read_as_zeros_after_writes_with_and_without_gaps() -> None:
    b = _reused()
    first = torch.full((5, 4), 1, dtype=torch.uint8)
    gap = torch.full((2, 4), 2, dtype=torch.uint8)
    b.write(0, first)
    b.write(8, gap)  # rows 5..7 are skipped
    rows = b.rows()
    assert torch.equal(rows[:5], first) and torch.equal(rows[8:10], gap)
    assert int(rows[5:8].sum()) == 0 and int(rows[10:].sum()) == 0


def test_rows_handed_out_before_any_write_are_all_zero_and_later_writes_land() -> None:
    b = _reused()
    assert int(b.rows().sum()) == 0
    b.write(3, torch.full((1, 4), 9, dtype=torch.uint8))
    assert b.rows()[3].tolist() == [9, 9, 9, 9] and int(b.rows().sum()) == 36


def test_bad_write_changes_nothing() -> None:
    b = _reused()
    with pytest.raises(InvalidArgument, match="outside the history"):
        b.write(11, torch.full((2, 4), 0x5A, dtype=torch.uint8))  # row 11 fits, row 12 not
    assert not bool(b.backed_mask().any())
    b.write(0, torch.ones(1, 4, dtype=torch.uint8))
    assert int(b.rows()[1:].sum()) == 0  # row 11 neither written nor left as reused bytes
