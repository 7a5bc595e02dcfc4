"""Draft ring (eq. 9–10) and speculative memory accounting (§3.4)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import InvalidArgument
from services.decode.spec.memory import ring_bytes, ring_rows, spec_memory, staging_bytes
from services.decode.spec.ring import DraftRing

GIB = 2**30


def test_ring_rows_matches_paper_and_hand_values():
    assert ring_rows(2048, 64, 8) == 2176  # paper §3.4, GLM-5.3 / DFlash2
    assert ring_rows(2048, 64, 6) == 2176 and ring_rows(2048, 64, 4) == 2176
    assert ring_rows(16, 16, 4) == 48      # 16·ceil(35/16)
    assert ring_rows(1, 1, 1) == 2


def test_ring_and_staging_bytes_match_paper_glm_figures():
    ring = ring_bytes(2048, 64, 8, draft_row_bytes=12_288, slots=35)
    assert ring == 2176 * 12_288 * 35 == 935_854_080
    assert round(ring / GIB, 2) == 0.87
    staged = staging_bytes(4, 35, 8, 2048, 576)
    assert staged == 1_321_205_760 and round(staged / GIB, 2) == 1.23
    assert round(staging_bytes(78, 35, 8, 2048, 576) / GIB, 1) == 24.0
    mem = spec_memory(window=2048, page=64, k_max=8, draft_row_bytes=12_288, live_sources=4,
                      slots=35, top_k=2048, row_bytes=576)
    assert mem.ring_rows == 2176 and mem.per_worker == ring + staged
    assert mem.per_session == 2176 * 12_288 + 4 * 8 * 2048 * 576


@pytest.mark.parametrize(("fn", "args", "needle"), [
    (ring_rows, (0, 64, 8), "window=0"),
    (ring_bytes, (16, 16, 4, 0), "draft_row_bytes=0"),
    (staging_bytes, (4, 35, 8, -1, 576), "top_k=-1"),
])
def test_memory_functions_reject_non_positive(fn, args, needle):
    with pytest.raises(InvalidArgument, match=needle):
        fn(*args)


def _ring(slots=3, window=5, page=4, k_max=3) -> DraftRing:
    return DraftRing(slots, window, page, k_max, (2,), torch.float32)


def test_address_is_eq_10_and_memory_is_context_independent():
    ring = _ring()
    R = ring.rows_per_slot
    assert R == 12 and ring.address(2, 31) == 2 * R + 31 % R
    before = (ring.nbytes, ring.storage.data_ptr())
    for start in range(0, 400, 6):
        ring.write(1, start, torch.full((6, 2), float(start)))
    assert (ring.nbytes, ring.storage.data_ptr()) == before == (3 * R * 2 * 4, before[1])
    assert ring.read(1, torch.tensor([399]))[0, 0] == 396.0


@settings(max_examples=40, deadline=None)
@given(window=st.integers(1, 9), page=st.integers(1, 8), k_max=st.integers(1, 6),
       ops=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6), st.integers(0, 6)),
                    max_size=40))
def test_live_positions_never_collide_and_read_back(window, page, k_max, ops):
    """Random rounds (write a block past the frontier, roll back some) on 3 slots."""
    ring = DraftRing(3, window, page, k_max, (1,), torch.float64)
    R, truth = ring.rows_per_slot, {}
    assert R >= window + k_max
    for slot, size, reject in ops:
        f = ring.frontier(slot)
        size = min(size, k_max)
        vals = torch.tensor([[slot * 1e6 + f + i + 0.5] for i in range(size)],
                            dtype=torch.float64)
        ring.write(slot, f, vals)
        for i in range(size):
            truth[(slot, f + i)] = float(vals[i, 0])
        ring.rollback(slot, f + size - min(reject, size))
        addrs = set()
        for s in range(3):
            live = ring.live(s)
            assert live.stop - live.start <= R
            for t in live:
                addr = ring.address(s, t)
                assert s * R <= addr < (s + 1) * R and addr not in addrs
                addrs.add(addr)
            if len(live):
                got = ring.read(s, torch.tensor(list(live)))[:, 0].tolist()
                assert got == [truth[(s, t)] for t in live]
            fr = ring.frontier(s)
            if fr:  # the drafter's whole window before the frontier stays live
                assert ring.window_positions(s, fr - 1).start >= live.start


def test_rollback_is_a_pointer_move_that_restores_the_round_start():
    ring = _ring()
    ring.write(0, 0, torch.arange(14.0).view(7, 2))
    frontier = ring.frontier(0)
    window = torch.tensor(list(ring.window_positions(0, frontier - 1)))
    before, ptr = ring.read(0, window).clone(), ring.storage.data_ptr()
    ring.write(0, frontier, torch.full((3, 2), -1.0))  # a K_max round, all rejected
    ring.rollback(0, frontier)
    assert ring.frontier(0) == frontier and ring.storage.data_ptr() == ptr
    assert torch.equal(ring.read(0, window), before)
    assert ring.live(0) == range(0, 7)
    with pytest.raises(InvalidArgument, match="must be live"):
        ring.read(0, torch.tensor([7]))  # the rejected row is not readable


def test_ring_rejects_gaps_oversized_chunks_and_bad_slots():
    ring = _ring()
    with pytest.raises(InvalidArgument, match=r"start=2 must be in base=0\.\.frontier=0"):
        ring.write(0, 2, torch.zeros(1, 2))
    with pytest.raises(InvalidArgument, match="rows=8 must be <= R_d - W = 7"):
        ring.write(0, 0, torch.zeros(8, 2))
    with pytest.raises(InvalidArgument, match="slot=3"):
        ring.frontier(3)
    ring.reset(1, base=10)
    with pytest.raises(InvalidArgument, match="n=9 must be >= base=10"):
        ring.rollback(1, 9)
    assert ring.pointer_state(1) == (10, 10, 10)
