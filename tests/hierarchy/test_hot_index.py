"""``hot_index``, the inverse of ``hot_rows`` (request.py): the reference's updates keep it
exact, and the check of invariant I4 catches a stale entry; ``hot_rank``, the CUDA lookup's
cache of the held rows: every writer makes it stale, and I4 checks it where it is valid."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.decode.hierarchy.invariants import assert_hot_index, assert_hot_rank
from services.decode.hierarchy.request import (
    HOT_SLOT_BITS,
    RANK_BUILT,
    RANK_VERSION,
    RANK_WORDS,
    new_request_state,
    rank_cache_contents,
    rank_layout,
    rank_words,
    reindex_hot,
    set_hot_rows,
    set_hot_rows_where,
)

ROWS, SLOTS = 40, 6


def _state(held: list[int]):
    s = new_request_state("a", ROWS, 0, ROWS, [0, 1, 2], SLOTS, 4, 4, torch.device("cpu"))
    s.hot_rows[:] = torch.tensor(held)
    reindex_hot(s)
    return s


@st.composite
def _moves(draw):
    """A hot cache with distinct rows (I4) and a batch of (slot, row, valid) moves: slots
    distinct, rows distinct and held by no slot (the premises of both updates)."""
    rows = draw(st.lists(st.integers(0, ROWS - 1), min_size=SLOTS, max_size=SLOTS, unique=True))
    held = [r if draw(st.booleans()) else -1 for r in rows]
    n = draw(st.integers(0, SLOTS))
    slots = draw(st.permutations(range(SLOTS)))[:n]
    free = [r for r in range(ROWS) if r not in held]
    new = draw(st.lists(st.sampled_from(free), min_size=n, max_size=n, unique=True))
    valid = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return held, slots, new, valid


@settings(max_examples=300, deadline=None)
@given(_moves())
def test_the_device_read_free_update_equals_the_masked_one(moves) -> None:
    held, slots, new, valid = moves
    a, b = _state(held), _state(held)
    t = dict(dtype=torch.int64)
    mask = torch.tensor(valid, dtype=torch.bool)
    set_hot_rows_where(a, torch.tensor(slots, **t), torch.tensor(new, **t), mask)
    set_hot_rows(b, torch.tensor(slots, **t)[mask], torch.tensor(new, **t)[mask])
    assert torch.equal(a.hot_rows, b.hot_rows)
    assert torch.equal(a.hot_index, b.hot_index)
    assert_hot_index(a)


def test_entries_pack_the_slots_pool_row_and_a_stale_entry_is_caught() -> None:
    s = _state([7, -1, 3, -1, -1, -1])
    assert int(s.hot_index[7]) == int(s.hot_locs[0]) << HOT_SLOT_BITS | 0
    assert int(s.hot_index[3]) == int(s.hot_locs[2]) << HOT_SLOT_BITS | 2
    assert int((s.hot_index >= 0).sum()) == 2
    set_hot_rows(s, torch.tensor([0]), torch.tensor([9]))  # row 7 leaves, row 9 enters
    assert int(s.hot_index[7]) == -1 and int(s.hot_index[9]) & 0xFFFFF == 0
    assert_hot_index(s)
    s.hot_rows[1] = 11  # written past the index
    with pytest.raises(AssertionError, match=r"I4: hot_index of 'a' disagrees .* rows \[11\]"):
        assert_hot_index(s)


# -- hot_rank: the CUDA lookup's cache of the held rows ---------------------------------
def test_every_writer_of_hot_rows_makes_the_rank_cache_stale() -> None:
    s = _state([7, -1, 3, -1, -1, -1])
    v = int(s.hot_rank[RANK_VERSION])
    set_hot_rows(s, torch.tensor([1]), torch.tensor([9]))
    set_hot_rows_where(s, torch.tensor([3]), torch.tensor([11]), torch.tensor([True]))
    reindex_hot(s)
    assert int(s.hot_rank[RANK_VERSION]) == v + 3
    set_hot_rows_where(s, torch.tensor([4]), torch.tensor([12]), torch.tensor([False]))
    assert int(s.hot_rank[RANK_VERSION]) == v + 3  # no pair moved: the cache stays valid
    assert int(s.hot_rank[RANK_BUILT]) == -1  # a new request's cache was never built


def _built(s, words: int):
    """s with its rank cache built as the lookup builds it (the torch reference)."""
    ent_at, bits_at, pre_at, _ = rank_layout(s.max_rows, s.hot_rows.numel())
    entries, bits, prefix = rank_cache_contents(s, words)
    s.hot_rank[ent_at : ent_at + entries.numel()] = entries
    s.hot_rank[bits_at:].view(torch.int32)[:words] = bits.to(torch.int32)
    s.hot_rank[pre_at:].view(torch.int16)[:words] = prefix.to(torch.int16)
    s.hot_rank[RANK_WORDS] = words
    s.hot_rank[RANK_BUILT] = s.hot_rank[RANK_VERSION]
    return s


def test_rank_cache_holds_the_held_rows_entries_in_row_order() -> None:
    s = _built(_state([33, -1, 3, 31, -1, 7]), 2)
    entries, bits, prefix = rank_cache_contents(s, 2)
    assert entries.tolist() == [int(s.hot_index[r]) for r in (3, 7, 31, 33)]
    assert bits.tolist() == [(1 << 3) | (1 << 7) | (1 << 31), 1 << 1]
    assert prefix.tolist() == [0, 3]  # row 33 (word 1) has rank 3
    assert rank_cache_contents(s, 1)[0].tolist() == entries[:3].tolist()  # rows < 32 only
    assert_hot_rank(s)


def test_a_wrong_valid_rank_cache_is_caught_and_a_stale_one_is_not_checked() -> None:
    s = _built(_state([33, -1, 3, 31, -1, 7]), 2)
    ent_at = rank_layout(s.max_rows, SLOTS)[0]
    s.hot_rank[ent_at + 1] += 1 << HOT_SLOT_BITS  # row 7's entry: another pool row
    with pytest.raises(AssertionError, match="I4: hot_rank entries of 'a'"):
        assert_hot_rank(s)
    s = _built(_state([33, -1, 3, 31, -1, 7]), 2)
    pre_at = rank_layout(s.max_rows, SLOTS)[2]
    s.hot_rank[pre_at:].view(torch.int16)[1] = 2  # word 1's prefix: one held row too few
    with pytest.raises(AssertionError, match=r"I4: hot_rank prefix of 'a' wrong at words \[1\]"):
        assert_hot_rank(s)
    s = _built(_state([33, -1, 3, 31, -1, 7]), 2)
    s.hot_rows[1] = 12  # written without the writers' bump: the bitmap now misses row 12
    with pytest.raises(AssertionError, match=r"I4: hot_rank bitmap of 'a' wrong at words \[0\]"):
        assert_hot_rank(s)
    reindex_hot(s)  # a writer: the cache goes stale and is rebuilt before it is read again
    assert_hot_rank(s)


@pytest.mark.parametrize("max_rows", [1, 129, 300, 1000, 100_000])
@pytest.mark.parametrize("slots", [1, 5, 4096])
def test_rank_layout_keeps_each_part_16_byte_aligned(max_rows: int, slots: int) -> None:
    """The lookup reads the entries and bitmap in 16-byte loads and the prefix in 8-byte
    ones, and the benchmark stacks caches in one [batch, length] tensor."""
    ent_at, bits_at, pre_at, length = rank_layout(max_rows, slots)
    assert all(x % 2 == 0 for x in (ent_at, bits_at, pre_at, length))
    assert bits_at - ent_at >= slots and (pre_at - bits_at) * 2 == rank_words(max_rows)
    assert (length - pre_at) * 4 >= rank_words(max_rows)  # a u16 per bitmap word
