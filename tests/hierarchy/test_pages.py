"""Page operations: resident-first admit, backup -> retire, populate, commit, release."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import FailedPrecondition, ResourceExhausted
from services.decode.hierarchy import (
    HierarchyConfig,
    admit,
    backup,
    can_admit,
    commit_rows,
    completed_rows,
    coverage,
    open_rows,
    optional_pages,
    populate,
    publish_pages,
    release,
    retire,
)
from services.decode.hierarchy.invariants import assert_exact
from tests.hierarchy.harness import Harness, assert_same, snapshot


def test_required_pages_cover_hot_cache_and_tail() -> None:
    cfg = HierarchyConfig(num_pages=8, page_rows=4, hot_slots=5, tail_rows=7)
    assert cfg.required_pages == 2 + 2
    resident = HierarchyConfig(num_pages=8, page_rows=4, tail_rows=7, policy="resident")
    assert resident.required_pages == 2


def test_completed_rows_packs_m_positions_per_row() -> None:
    assert [completed_rows(n, 4) for n in (0, 3, 4, 9)] == [0, 0, 1, 2]
    assert completed_rows(7) == 7


def test_resident_first_admission_keeps_history_on_device_unbacked(device: str) -> None:
    h = Harness(device, policy="adaptive")
    state = h.admit("a", 32, 10)
    assert state.page_ready.tolist()[:3] == [True, True, False]
    assert (state.tail_lo, state.committed, state.tail_hi) == (8, 10, 10)
    assert not h.group.backed_mask(state).any()  # host backup deferred
    assert h.group.pages.counts() == {"required": 3, "optional": 2, "free": 19, "reserve": 1}
    assert optional_pages(h.group, "a") == 2 and coverage(h.group) == 1.0
    h.check()


def test_admission_spills_history_that_does_not_fit_to_host(device: str) -> None:
    h = Harness(device, policy="adaptive", num_pages=7, reserve_pages=1)
    state = h.admit("a", 40, 22)  # 5 full pages; 6 available - 3 required = 3 optional
    assert state.page_ready.tolist()[:5] == [True, True, True, False, False]
    backed = h.group.backed_mask(state)
    assert backed[12:20].all() and not backed[:12].any() and not backed[20:].any()
    assert coverage(h.group) == pytest.approx(3 / 5)
    assert h.group.pages.counts()["free"] == 1  # only the reserve is left
    h.check()
    assert not can_admit(h.group, 0)
    before = snapshot(h)
    with pytest.raises(ResourceExhausted, match="required pages=3 > available pages=0"):
        h.admit("b", 8, 0)
    assert_same(before, snapshot(h))


def test_backup_then_retire_then_host_fetch(device: str) -> None:
    h = Harness(device, policy="adaptive")
    h.admit("a", 32, 10)
    before = snapshot(h)
    with pytest.raises(FailedPrecondition, match=r"page=0 .* without host backing"):
        retire(h.group, "a")
    assert_same(before, snapshot(h))
    assert backup(h.group, "a", max_pages=1) == 4  # bounded: page 0 only
    with pytest.raises(FailedPrecondition, match="page=1"):
        retire(h.group, "a")
    assert backup(h.group, "a") == 4
    assert backup(h.group, "a") == 0  # nothing device-only is left
    h.check()
    assert retire(h.group, "a") == 2
    assert h.group.pages.counts()["optional"] == 0 and coverage(h.group) == 0.0
    h.check()
    h.open("a", 1)
    plan = h.resolve(["a"], [[[1, 6, 9]]])
    assert (plan.counts.host, plan.counts.tail) == (2, 1)


def test_retire_waits_for_earlier_readers(device: str) -> None:
    h = Harness(device, policy="adaptive")
    h.admit("a", 32, 10)
    backup(h.group, "a")
    h.open("a", 1)
    h.resolve(["a"], [[[1]]])  # epoch 1 reads page 0
    before = snapshot(h)
    with pytest.raises(FailedPrecondition, match="epoch=1 not finished"):
        retire(h.group, "a", [0])
    assert_same(before, snapshot(h))
    h.group.readers_finished(1)
    assert retire(h.group, "a", [0]) == 1
    assert h.group.request("a").page_map.tolist()[:2][0] == -1
    h.check()


def test_populate_is_bounded_and_publishes_after_copy(device: str) -> None:
    h = Harness(device, policy="adaptive")
    h.admit("a", 40, 17)  # 4 optional pages
    backup(h.group, "a")
    retire(h.group, "a")
    assert populate(h.group, "a", max_pages=3) == 3
    assert h.group.request("a").page_ready.tolist()[:4] == [True, True, True, False]
    h.check()
    assert populate(h.group, "a", max_pages=3) == 1
    assert populate(h.group, "a", max_pages=3) == 0 and coverage(h.group) == 1.0
    h.open("a", 1)
    plan = h.resolve(["a"], [[[0, 15, 16, 17]]])
    assert plan.direct.tolist() == [True] and plan.counts.optional == 2
    h.check()


def test_reserved_pages_are_not_read_before_they_are_published(device: str) -> None:
    h = Harness(device, policy="adaptive")
    h.admit("a", 32, 9)
    backup(h.group, "a")
    retire(h.group, "a")
    assert populate(h.group, "a", max_pages=2, publish=False) == 2
    s = h.group.request("a")
    assert (s.page_map[:2] >= 0).all() and not s.page_ready[:2].any()
    assert h.group.pages.counts()["optional"] == 2
    h.check()
    h.open("a", 1)
    plan = h.resolve(["a"], [[[1, 6]]])  # pending pages: served from host, not the page
    assert (plan.counts.host, plan.counts.optional) == (2, 0)
    assert publish_pages(h.group, "a") == 2
    plan = h.resolve(["a"], [[[1, 6]]])
    assert plan.direct.tolist() == [True] and plan.counts.optional == 2
    h.check()


def test_populate_stops_at_the_reserve(device: str) -> None:
    h = Harness(device, policy="adaptive", num_pages=8, reserve_pages=2)
    h.admit("a", 40, 24)  # 6 pages; 6 available - 3 required = 3 optional
    backup(h.group, "a")
    assert populate(h.group, "a", max_pages=5) == 0
    assert h.group.pages.counts()["free"] == 2
    h.check()


def test_commit_makes_generated_rows_history_after_backup(device: str) -> None:
    h = Harness(device, policy="adaptive")
    h.admit("a", 32, 6)  # 1 optional page, rows 4-5 in the tail
    h.open("a", 3)  # rows 6, 7, 8: a round of K = 3
    assert commit_rows(h.group, "a", 8) == 2  # row 8 rejected (I5)
    s = h.group.request("a")
    assert (s.tail_lo, s.committed, s.tail_hi) == (4, 8, 8)
    h.check()
    assert backup(h.group, "a") == 8  # tail page 1 first, then optional page 0
    assert s.tail_lo == 8
    assert h.group.backed_mask(s)[:8].all() and not h.group.backed_mask(s)[8:].any()
    h.check()
    h.open("a", 1)  # row 8 again, new bytes
    plan = h.resolve(["a"], [[[5, 8, 0]]])
    assert (plan.counts.host, plan.counts.tail, plan.counts.optional) == (1, 1, 1)
    h.check()


def test_tail_overflows_until_completed_pages_are_backed(device: str) -> None:
    h = Harness(device, policy="hisparse")  # T = 7, p = 4
    h.admit("a", 32, 3)
    h.open("a", 4)
    commit_rows(h.group, "a", 7)
    before = snapshot(h)
    with pytest.raises(ResourceExhausted, match="tail_rows=7"):
        open_rows(h.group, "a", 1)  # rows [0, 8) would need 8 tail rows
    assert_same(before, snapshot(h))
    backup(h.group, "a")
    h.open("a", 3)
    h.check()


def test_resident_policy_keeps_everything_on_device(device: str) -> None:
    h = Harness(device, policy="resident")
    h.admit("a", 32, 9)
    assert h.group.pages.counts()["required"] == 2 + 2
    h.open("a", 4)
    commit_rows(h.group, "a", 13)  # rows 8-11 move into a history page
    s = h.group.request("a")
    assert s.tail_lo == 12 and s.page_ready.tolist()[:4] == [True, True, True, False]
    assert s.map_hi == 3  # the history page made at commit raised the mapped bound
    h.open("a", 1)
    plan = h.resolve(["a"], [[[0, 9, 12, 13]]])
    assert plan.direct.tolist() == [True] and s.backings == []
    with pytest.raises(FailedPrecondition, match="resident"):
        backup(h.group, "a")
    with pytest.raises(FailedPrecondition, match="resident"):
        populate(h.group, "a", 1)
    h.check()
    h.group.readers_finished()
    release(h.group, "a")
    assert h.group.pages.counts()["free"] == h.config.num_pages
    h.check()


def test_hisparse_admits_history_to_host(device: str) -> None:
    h = Harness(device, policy="hisparse")
    state = h.admit("a", 32, 13)
    assert h.group.backed_mask(state)[:12].all() and not state.page_ready.any()
    assert h.group.pages.counts()["optional"] == 0
    with pytest.raises(FailedPrecondition, match="hisparse"):
        populate(h.group, "a", 1)
    h.check()


def test_admit_from_an_existing_host_history(device: str) -> None:
    h = Harness(device, policy="adaptive")
    rows = [h.random_rows(16) for _ in range(2)]
    for layer, sid in enumerate(h.group.source_ids):  # prefill wrote the host history
        backing = h.provider.open("a", sid, 8, 16)
        backing.write(0, rows[layer][:9])
        backing.commit(0, 9)
        h.truth[("a", layer)] = rows[layer]
    state = admit(h.group, "a", 16, None, imported_rows=9)
    assert state.page_ready.tolist()[:3] == [True, True, False]
    assert (state.tail_lo, state.tail_hi) == (8, 9)
    h.check()


def test_release_returns_every_page_slot_and_history(device: str) -> None:
    h = Harness(device, policy="adaptive", staging_rows=4)
    h.admit("a", 32, 16)
    h.admit("b", 32, 5)
    backup(h.group, "a")
    retire(h.group, "a", [1, 3])
    h.open("a", 2)
    h.resolve(["a"], [[[4, 5, 6, 7], [12, 13, -1, 0]]])  # 6 misses: 3 hot, 3 staged
    assert len(h.group.staging.staged) == 3
    before = snapshot(h)
    with pytest.raises(FailedPrecondition, match="not finished"):
        release(h.group, "a")
    assert_same(before, snapshot(h))
    h.group.readers_finished()
    release(h.group, "a")
    assert ("a", 0) not in h.provider.histories and ("b", 0) in h.provider.histories
    h.check()
    release(h.group, "b")
    assert h.group.pages.counts()["free"] == h.config.num_pages
    assert len(h.group.staging.free_locs) == 4 and not h.provider.histories
    h.check()
    h.admit("a", 32, 16)  # the same id can be admitted again
    h.check()


def test_torch_device_parameter_places_every_tensor(device: str) -> None:
    h = Harness(device, policy="adaptive")
    s = h.admit("a", 32, 10)
    want = torch.empty(0, device=device).device
    for t in (s.hot_rows, s.tail_locs, s.page_map, *h.group.payloads):
        assert t.device == want


def test_backup_writes_and_commits_once_per_run_of_consecutive_pages() -> None:
    """A history's pages go to the host as one write and one commit per layer and run of
    consecutive pages (a commit is an RPC on the kvstore client), with the same bytes."""
    calls: list[tuple[str, int, int]] = []
    h = Harness("cpu", policy="adaptive", page_rows=4, num_pages=40, tail_rows=8)
    h.admit("a", 64, 40)  # 10 optional pages
    for layer, b in enumerate(h.group.request("a").backings):
        write, commit = b.write, b.commit
        b.write = lambda s, d, w=write, i=layer: (calls.append(("w", i, s)), w(s, d))[1]
        b.commit = lambda s, e, c=commit, i=layer: (calls.append(("c", i, s)), c(s, e))[1]
    assert backup(h.group, "a", max_pages=3) == 12  # pages 0-2: one run
    assert sorted(calls) == [("c", 0, 0), ("c", 1, 0), ("w", 0, 0), ("w", 1, 0)]
    h.check()  # backed rows equal the truth
    calls.clear()
    assert backup(h.group, "a") == 28  # pages 3-9: one run
    assert len(calls) == 4 and {s for _, _, s in calls} == {12}
    h.check()


def test_release_whose_host_close_fails_still_frees_and_closes_the_rest(
        device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A history's close raising (a store that answers with an error) does not leave the
    request admitted on pages that are already free: the request goes, every other history
    is closed, the error surfaces."""
    from services.common.errors import DeadlineExceeded
    from services.decode.hierarchy import release
    from services.decode.hierarchy.backing import InProcessBackingProvider
    from services.decode.hierarchy.invariants import assert_no_leak

    h = Harness(device, policy="hisparse")
    h.admit("a", 16, 9)
    group, close = h.group, InProcessBackingProvider.close
    free = len(group.pages.free_ids)
    sid0 = group.source_ids[0]

    def flaky(self, request_id: str, source_id: int) -> None:
        if source_id == sid0:
            raise DeadlineExceeded("the kvstore did not answer")
        close(self, request_id, source_id)

    monkeypatch.setattr(InProcessBackingProvider, "close", flaky)
    with pytest.raises(DeadlineExceeded):
        release(group, "a")
    assert "a" not in group.requests
    assert len(group.pages.free_ids) == group.pages.num_pages > free  # all back: "a" was alone
    assert sorted(h.provider.histories) == [("a", sid0)]  # only the failing one is left
    assert_no_leak(group)


@pytest.mark.parametrize("policy", ["hisparse", "resident"])
def test_open_keeps_the_tail_slots_unfinished_readers_hold(device: str, policy: str) -> None:
    """A plan read rows 12 and 13 from the tail (ring slots 5 and 6 of 7); then a backup
    (or a resident commit) moved tail_lo past them, and a second read came after it.
    Opening row 19 or 20 would write those slots: refused, nothing changed, while the first
    plan's readers are unfinished (the hypothesis state machine's counterexample: the plan's
    rows were overwritten; a review's: the second read forgot the first's tail); rows 16-18
    take the slots of rows 9-11, which no reader held. Once the readers finish, the rows
    open."""
    h = Harness(device, policy=policy, layers=1)
    h.admit("a", 28, 14)  # tail_lo 12, committed 14
    h.open("a", 2)
    if policy != "resident":
        commit_rows(h.group, "a", 16)  # tail_lo stays 12 until the backup
    sel = h.tensor([[[13, 12]]])
    plan = h.resolve(["a"], sel, visible=[[16]])
    ring = h.group.request("a").tail_locs
    assert plan.locations.flatten().tolist() == ring[[13 % 7, 12 % 7]].tolist()
    if policy == "resident":
        commit_rows(h.group, "a", 16)  # rows 12-15 copied to a page: tail_lo 16
    else:
        assert backup(h.group, "a") == 4  # page 3 (rows 12-15), the tail's first
    h.resolve(["a"], [[[15, 11]]], visible=[[16]])  # rows no longer in the tail
    s = h.group.request("a")
    assert (s.tail_lo, s.tail_hi) == (16, 16) and h.group.readers_pending(s)
    before = snapshot(h)
    with pytest.raises(FailedPrecondition,
                       match=r"reusing the tail slots of rows from 12 .* open at most 3 rows"):
        open_rows(h.group, "a", 4)
    assert_same(before, snapshot(h))
    h.open("a", 3)  # rows 16-18: the slots of rows 9-11
    assert_exact(h.group, h.truth, plan, sel)
    h.group.readers_finished()
    h.open("a", 2)  # rows 19, 20: slots 5, 6
    h.check()


def test_open_does_not_rewrite_a_dropped_row_unfinished_readers_resolved(device: str) -> None:
    """A round's own rows 14 and 15 were opened and read; a commit then dropped them (not
    accepted), and a second read came after it. Reopening row 14 would write new bytes into
    the slot the first readers hold for it: refused, nothing changed, until they finish."""
    h = Harness(device, policy="hisparse", layers=1)
    h.admit("a", 28, 14)
    h.open("a", 2)
    sel = h.tensor([[[15, 14]]])
    plan = h.resolve(["a"], sel, visible=[[16]])
    commit_rows(h.group, "a", 14)  # rows 14 and 15 dropped
    h.resolve(["a"], [[[13]]], visible=[[14]])
    before = snapshot(h)
    with pytest.raises(FailedPrecondition,
                       match=r"reopens row 14, dropped after readers of epochs 1\.\.2 of "
                             r".* up to 16"):
        open_rows(h.group, "a", 1)
    assert_same(before, snapshot(h))
    assert_exact(h.group, h.truth, plan, sel)
    h.group.readers_finished()
    h.open("a", 2)
    h.check()


def test_map_hi_bounds_the_mapped_pages_and_a_low_one_breaks_i4(device: str) -> None:
    """The CUDA lookup loads no page_map / page_ready entry at or past map_hi: every writer
    of page_map raises it, retire leaves it, and the I4 check fails where it is too low."""
    h = Harness(device, policy="adaptive")
    s = h.admit("a", 40, 17)  # pages 0-3 on the device at admission
    assert s.map_hi == 4
    backup(h.group, "a")
    retire(h.group, "a")
    assert s.map_hi == 4 and not (s.page_map >= 0).any()  # retiring never lowers it
    assert populate(h.group, "a", max_pages=2, publish=False) == 2
    assert s.map_hi == 4
    h.check()
    s.map_hi = 1  # page 1 is mapped (reserved): a lookup past the bound would miss it
    with pytest.raises(AssertionError, match="map_hi=1"):
        h.check()
    s.map_hi = 2
    h.check()
    fresh = Harness(device, policy="adaptive", num_pages=7, reserve_pages=1).admit("b", 40, 22)
    assert fresh.map_hi == 3  # 3 of its 5 history pages fit on the device
