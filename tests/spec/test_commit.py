"""Commit math of a verification round (eq. 7–8)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import InvalidArgument
from services.decode.spec.commit import commit_batch, commit_round, completed_rows


def test_eq7_partial_acceptance_emits_correction():
    c = commit_round(100, [7, 8, 9, 10], accepted=2, bonus=42, k_max=4)
    assert c.new_output == [8, 9, 42]
    assert c.committed_prefix == [7, 8, 9]
    assert c.n_committed == 103


def test_eq7_extremes():
    none = commit_round(5, [7, 8, 9], accepted=0, bonus=1, k_max=4)
    assert (none.new_output, none.committed_prefix, none.n_committed) == ([1], [7], 6)
    full = commit_round(5, [7, 8, 9], accepted=2, bonus=1, k_max=4)
    assert (full.new_output, full.committed_prefix, full.n_committed) == ([8, 9, 1], [7, 8, 9], 8)
    plain = commit_round(0, [3], accepted=0, bonus=4, k_max=1)  # K_r = 1: ordinary decode
    assert (plain.new_output, plain.n_committed) == ([4], 1)


def test_eq8_completed_rows_with_packing():
    assert completed_rows(5, 8) == range(5, 8)
    assert completed_rows(5, 9, positions_per_row=4) == range(1, 2)
    assert completed_rows(3, 4, positions_per_row=4) == range(0, 1)
    assert completed_rows(4, 7, positions_per_row=4) == range(1, 1)  # group still in tail
    assert completed_rows(6, 17, positions_per_row=4) == range(1, 4)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 8), rounds=st.lists(st.integers(0, 7), max_size=30))
def test_eq8_rounds_complete_every_row_exactly_once(m, rounds):
    n, seen = 0, []
    for a in rounds:
        n_new = n + 1 + a
        seen.extend(completed_rows(n, n_new, m))
        n = n_new
    assert seen == list(range(n // m))


def test_commit_batch_vectorized_and_validated():
    n = torch.tensor([10, 0, 7])
    out = commit_batch(n, torch.tensor([4, 1, 3]), torch.tensor([3, 0, 1]), k_max=4)
    assert out.tolist() == [14, 1, 9]
    with pytest.raises(InvalidArgument, match=r"num_queries=5 must be in 1\.\.k_max=4"):
        commit_batch(n, torch.tensor([5, 1, 3]), torch.tensor([0, 0, 0]), k_max=4)
    with pytest.raises(InvalidArgument, match=r"accepted=3 must be in 0\.\.num_queries-1=2"):
        commit_batch(n, torch.tensor([4, 1, 3]), torch.tensor([0, 0, 3]), k_max=4)
    with pytest.raises(InvalidArgument, match="shapes"):
        commit_batch(n, torch.tensor([4, 1]), torch.tensor([0, 0]), k_max=4)


@pytest.mark.parametrize(("args", "needle"), [
    ((0, [1, 2, 3, 4, 5], 0, 0, 4), "num_queries=5"),
    ((0, [1, 2], 2, 0, 4), "accepted=2"),
    ((0, [1, 2], -1, 0, 4), "accepted=-1"),
    ((-1, [1], 0, 0, 4), "n=-1"),
])
def test_commit_round_rejects_out_of_range(args, needle):
    with pytest.raises(InvalidArgument, match=needle):
        commit_round(*args)
    with pytest.raises(InvalidArgument, match="positions_per_row=0"):
        completed_rows(0, 1, 0)
