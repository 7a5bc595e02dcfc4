"""Staging promotion (paper §3.4): the batched ``release_staging`` equals promoting the
staged rows one by one, as DESIGN defines it (requests and rows in acquisition order,
the LRU-first eligible slot not holding the row)."""

from __future__ import annotations

import copy

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import ResourceExhausted
from services.decode.hierarchy import release_staging
from services.decode.hierarchy.invariants import assert_hot_index
from services.decode.hierarchy.promotion import _promote_one
from services.decode.hierarchy.request import reindex_hot

from .harness import Harness, distinct_hot


def _staged_group(data, device: str = "cpu") -> Harness:
    slots = data.draw(st.integers(1, 6), label="hot_slots")
    h = Harness(device, hot_slots=slots, staging_rows=16)
    rids = ["a", "b"]
    for rid in rids:
        h.admit(rid, 40, 16)  # rows drawn below are committed (hot rows are, I4)
    g = h.group
    g.clock, g.finished_epoch = 8, 6  # stamps 7 and 8: protected slots (readers running)
    for rid in rids:
        s = g.request(rid)
        s.hot_rows[:] = torch.tensor(data.draw(st.lists(st.integers(-1, 12), min_size=slots,
                                                        max_size=slots)))
        s.hot_stamp[:] = torch.tensor(data.draw(st.lists(st.integers(0, 8), min_size=slots,
                                                         max_size=slots)))
        reindex_hot(s)
    # acquisitions: (request, epoch, rows), rows mostly distinct misses, sometimes not
    for _ in range(data.draw(st.integers(1, 4), label="acquisitions")):
        rid = data.draw(st.sampled_from(rids))
        epoch = data.draw(st.integers(1, 6))
        rows = data.draw(st.lists(st.integers(0, 12), min_size=1, max_size=4))
        if not g.staging.can_acquire(len(rows)):
            break
        locs = g.staging.acquire(rid, rows, epoch)
        for payload in g.payloads:
            payload[locs] = h.random_rows(len(locs)).to(payload.device)
    return h


def _one_by_one(g) -> int:
    entries = g.staging.entries()
    g.staging.release(g.finished_epoch)
    return sum(_promote_one(g, g.requests[e.request_id], e) for e in entries
               if g.requests[e.request_id].hot_rows.numel())


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_batched_promotion_equals_one_by_one(data) -> None:
    h = _staged_group(data)
    ref = copy.deepcopy(h.group)
    indexed = all(distinct_hot(s) for s in h.group.requests.values())
    assert release_staging(h.group) == _one_by_one(ref)
    for rid, s in h.group.requests.items():
        r = ref.requests[rid]
        assert torch.equal(s.hot_rows, r.hot_rows), rid
        assert torch.equal(s.hot_stamp, r.hot_stamp), rid
        if indexed:  # the index is defined under I4 only (the drawn hot rows may repeat)
            assert torch.equal(s.hot_index, r.hot_index), rid
            assert_hot_index(s)
    for a, b in zip(h.group.payloads, ref.payloads, strict=True):
        assert torch.equal(a, b)
    assert sorted(h.group.staging.free_locs) == sorted(ref.staging.free_locs)


def test_a_run_takes_eligible_slots_in_lru_order_until_they_run_out() -> None:
    h = Harness(hot_slots=4, staging_rows=8)
    h.admit("a", 40, 8)
    g, s = h.group, h.group.request("a")
    g.clock = g.finished_epoch = 5
    s.hot_rows[:] = torch.tensor([0, 1, 2, 3])
    s.hot_stamp[:] = torch.tensor([4, 1, 5, 2])  # slot 2 used in epoch 5: not eligible
    reindex_hot(s)
    locs = g.staging.acquire("a", [7, 8, 9, 10], 5)
    for payload in g.payloads:
        payload[locs] = h.random_rows(4).to(payload.device)
    want = [p[locs].clone() for p in g.payloads]
    assert release_staging(g) == 3  # three slots older than epoch 5
    assert s.hot_rows.tolist() == [9, 7, 2, 8]  # LRU order: slot 1 (1), 3 (2), 0 (4)
    assert s.hot_stamp.tolist() == [5, 5, 5, 5]
    assert_hot_index(s)
    for p, w in zip(g.payloads, want, strict=True):
        assert torch.equal(p[s.hot_locs[[1, 3, 0]]], w[:3])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["acquire", "release", "drop"]),
                          st.sampled_from(["a", "b"]), st.integers(0, 5), st.integers(1, 4)),
                max_size=30))
def test_arena_is_a_fifo_free_queue_with_staged_rows_in_acquisition_order(ops) -> None:
    """The tensor arena against the plain model: a deque of free rows (acquire pops
    left, release appends right) and a dict of staged rows in acquisition order."""
    from collections import deque

    from services.common.errors import FailedPrecondition, ResourceExhausted
    from services.decode.hierarchy.staging import StagingArena

    arena, free, staged = StagingArena(100, 8), deque(range(100, 108)), {}
    for i, (op, rid, epoch, n) in enumerate(ops):
        if op == "acquire":
            rows = [10 * i + j for j in range(n)]
            if n > len(free):
                try:
                    arena.acquire(rid, rows, epoch)
                    raise AssertionError("acquire beyond the free rows succeeded")
                except ResourceExhausted:
                    continue
            locs = arena.acquire(rid, rows, epoch).tolist()
            want = [free.popleft() for _ in rows]
            assert locs == want
            staged.update({loc: (rid, r, epoch) for loc, r in zip(locs, rows, strict=True)})
        elif op == "release":
            if max((e for _, _, e in staged.values()), default=0) > epoch:
                try:
                    arena.release(epoch)
                    raise AssertionError("release with readers pending succeeded")
                except FailedPrecondition:
                    continue
            arena.release(epoch)
            free.extend(staged)
            staged.clear()
        else:
            arena.drop_request(rid)
            gone = [loc for loc, (r, _, _) in staged.items() if r == rid]
            free.extend(gone)
            for loc in gone:
                del staged[loc]
        assert arena.free_locs == list(free)
        assert {loc: (e.request_id, e.row, e.epoch) for loc, e in arena.staged.items()} == staged
        assert list(arena.staged) == list(staged)
        assert sorted(arena.all_locs()) == list(range(100, 108))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_stamp_protects_the_slots_the_protect_flags_did(data) -> None:
    """Before e72ddf3 a resolve also wrote its epoch to a protect flag of each slot it
    stamped, nothing else wrote the flags, and a slot was protected while its flag was past
    finished_epoch. Resolves with more misses than unprotected slots (the rest staged),
    readers finishing part of the way and promotions, in any order: flags kept beside the
    state protect the slots the stamps protect after every step."""
    h = Harness("cpu", policy="hisparse", layers=1, hot_slots=4, staging_rows=24)
    g = h.group
    s = h.admit("a", 40, 32)  # rows below tail_lo = 32 resolve through the hot cache
    flags = torch.zeros_like(s.hot_stamp)
    for _ in range(data.draw(st.integers(1, 14), label="steps")):
        op = data.draw(st.sampled_from(["resolve", "resolve", "finish", "release"]))
        if op == "resolve":
            rows = data.draw(st.lists(st.integers(0, 31), min_size=1, max_size=6))
            before = s.hot_stamp.clone()
            try:
                h.resolve(["a"], [[rows]])
            except ResourceExhausted:  # staging full: nothing changed
                assert torch.equal(s.hot_stamp, before)
            flags = torch.where(s.hot_stamp != before, s.hot_stamp, flags)  # slots it returned
        elif op == "finish":
            g.readers_finished(data.draw(st.integers(g.finished_epoch, g.clock)))
        elif g.staging.max_epoch <= g.finished_epoch:
            release_staging(g)
        assert torch.equal(flags > g.finished_epoch, s.hot_stamp > g.finished_epoch)
        h.check()
