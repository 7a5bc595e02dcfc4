"""Invariant I3 (invariants.assert_exact) finds a wrong byte wherever a row lives: a tail
row, a ready optional page, a hot slot, a staged row, a backed host row, a plan's row."""

from __future__ import annotations

import pytest

from services.decode.hierarchy.invariants import assert_exact
from tests.hierarchy.harness import Harness


def staged_request() -> tuple[Harness, object, list]:
    """hisparse, B = 3: rows 0..15 on the host only, 16..18 in the tail; a resolve of five
    distinct host rows leaves three in hot slots and two staged."""
    h = Harness("cpu", policy="hisparse")
    h.admit("a", 32, 16)
    h.open("a", 3)
    sel = [[[4, 0, 9], [9, 4, 1], [0, 9, 12]]]
    plan = h.resolve(["a"], sel)
    assert plan.counts.staged_rows == 2
    h.check()
    return h, plan, sel


def flip(t, index) -> None:
    t[index] ^= 0xFF


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("where,message", [
    ("tail", "I3: tail of 'a'"), ("hot", "I3: hot of 'a'"), ("staged", "I3: staged row"),
    ("host", "I3: host rows of 'a'"),
])
def test_a_wrong_byte_in_any_device_or_host_row_is_found(layer: int, where: str,
                                                         message: str) -> None:
    h, plan, _ = staged_request()
    state, pool = h.group.request("a"), h.group.payload(layer)
    if where == "tail":
        target, index = pool, (int(state.tail_locs[state.tail_lo % state.tail_locs.numel()]), 0)
    elif where == "hot":
        target, index = pool, (int(state.hot_locs[0]), 3)
    elif where == "staged":
        target, index = pool, (int(plan.copy_dst[-1]), 7)
    else:
        target, index = state.backings[layer].rows(), (5, 1)
    flip(target, index)
    with pytest.raises(AssertionError, match=message):
        h.check()
    flip(target, index)  # back: the state holds again
    h.check()


def test_a_wrong_byte_in_a_ready_page_or_a_plan_row_is_found() -> None:
    h = Harness("cpu", policy="adaptive")
    h.admit("a", 32, 16)  # the imported rows fill optional pages, ready
    h.open("a", 1)
    state = h.group.request("a")
    page = state.optional_logical_pages()[0]
    assert bool(state.page_ready[page])
    row = int(state.page_map[page]) * h.group.config.page_rows
    flip(h.group.payload(1), (row, 2))
    with pytest.raises(AssertionError, match="I3: ready pages of 'a'"):
        h.check()
    flip(h.group.payload(1), (row, 2))
    h.check()
    sel = [[[page * h.group.config.page_rows, 16]]]
    plan = h.resolve(["a"], sel)
    loc = int(plan.locations[0, 0, 0])
    flip(h.group.payload(0), (loc, 0))
    with pytest.raises(AssertionError, match="I3: plan rows of 'a' layer 0"):
        assert_exact(h.group, h.truth, plan, h.tensor(sel))
