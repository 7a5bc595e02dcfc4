"""Resolver: LRU victims taken in slot order, protection, union dedup, staging, direct
skip, topologies."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import FailedPrecondition, ResourceExhausted
from services.decode.hierarchy import (
    apply_copies,
    backup,
    lru_order,
    release_staging,
    resolve,
    retire,
)
from services.decode.hierarchy.invariants import assert_exact
from tests.hierarchy.harness import Harness, assert_same, snapshot


def host_request(device: str, layers: int = 2, open_rows: int = 1, **sizes: int) -> Harness:
    """hisparse: rows 0..15 backed on host only, rows 16.. opened in the tail, B = 3."""
    h = Harness(device, policy="hisparse", layers=layers, **sizes)
    h.admit("a", 32, 16)
    h.open("a", open_rows)
    h.check()
    return h


def test_lru_order_breaks_ties_by_slot_index() -> None:
    stamp = torch.tensor([2, 0, 2, 1, 0])
    assert lru_order(stamp, torch.ones(5, dtype=torch.bool)).tolist() == [1, 4, 3, 0, 2]
    mask = torch.tensor([True, False, True, True, False])
    assert lru_order(stamp, mask).tolist() == [3, 0, 2]


def test_lru_victims_follow_stamp_then_slot_order(device: str) -> None:
    h = host_request(device)
    plan = h.resolve(["a"], [[[2, 0, 1]]])
    assert h.hot_rows("a") == [0, 1, 2]  # empty slots fill in slot order, rows ascending
    assert plan.copy_rows.tolist() == [0, 1, 2]
    assert plan.copy_dst.tolist() == h.hot_locs("a", [0, 1, 2])
    assert plan.locations.tolist() == [[h.hot_locs("a", [2, 0, 1])]]
    h.group.readers_finished()
    plan = h.resolve(["a"], [[[1]]])  # a hit makes slot 1 most recent, copies nothing
    assert plan.copy_rows.numel() == 0 and plan.counts.hot == 1
    h.group.readers_finished()
    plan = h.resolve(["a"], [[[6, 5]]])  # victims: slot 0 then slot 2 (stamp 1, 1 < 2)
    assert h.hot_rows("a") == [5, 1, 6]
    assert plan.copy_rows.tolist() == [5, 6]
    assert plan.copy_dst.tolist() == h.hot_locs("a", [0, 2])
    assert plan.locations.tolist() == [[h.hot_locs("a", [2, 0])]]
    h.group.readers_finished()
    h.resolve(["a"], [[[7]]])  # slot 1 (stamp 2) is now the least recent
    assert h.hot_rows("a") == [5, 7, 6]
    assert h.group.request("a").hot_stamp.tolist() == [3, 4, 3]
    h.check()


def test_misses_take_the_lru_victims_in_slot_order(device: str) -> None:
    h = host_request(device)
    h.resolve(["a"], [[[0, 1, 2]]])  # epoch 1: stamps [1, 1, 1]
    for row in (0, 1):  # epochs 2, 3: stamps [2, 3, 1]
        h.group.readers_finished()
        h.resolve(["a"], [[[row]]])
    h.group.readers_finished()
    plan = h.resolve(["a"], [[[8, 7]]])  # victims: slots 2 and 0 (LRU), taken in slot order
    assert h.hot_rows("a") == [7, 1, 8]
    assert plan.copy_rows.tolist() == [7, 8]
    assert plan.copy_dst.tolist() == h.hot_locs("a", [0, 2])
    assert plan.locations.tolist() == [[h.hot_locs("a", [2, 0])]]
    assert h.group.request("a").hot_stamp.tolist() == [4, 3, 4]
    h.check()


def test_selected_rows_are_protected_within_a_round(device: str) -> None:
    h = host_request(device)
    h.resolve(["a"], [[[0, 1, 2]]])
    h.group.readers_finished()
    plan = h.resolve(["a"], [[[1, 8, 9]]])  # all stamps equal: without protection 9 -> slot 1
    assert h.hot_rows("a") == [8, 1, 9]
    assert plan.locations[0, 0, 0].item() == h.hot_locs("a", [1])[0]
    assert (plan.counts.hot, plan.counts.host) == (1, 2)
    h.check()


def test_unfinished_readers_protect_slots_and_overflow_goes_to_staging(device: str) -> None:
    h = host_request(device)
    h.resolve(["a"], [[[0, 1, 2]]])  # epoch 1, readers not finished
    plan = h.resolve(["a"], [[[3]]])
    base = h.group.staging.base_row
    assert plan.copy_dst.tolist() == [base]
    assert h.hot_rows("a") == [0, 1, 2]
    assert plan.counts.staged_rows == 1
    with pytest.raises(FailedPrecondition, match="epoch=2"):
        release_staging(h.group)
    h.group.readers_finished()
    assert release_staging(h.group) == 1  # promoted into the LRU slot not used in epoch 2
    assert h.hot_rows("a") == [3, 1, 2]
    assert len(h.group.staging.free_locs) == h.config.staging_rows
    h.check()
    plan = h.resolve(["a"], [[[3, 1]]])
    assert plan.copy_rows.numel() == 0 and plan.counts.hot == 2


def test_union_of_k_queries_copies_each_missing_row_once(device: str) -> None:
    h = host_request(device, open_rows=3)
    sel = [[[4, 0, 9], [9, 4, 1], [0, 9, 12]]]  # each query fits B = 3, the union does not
    plan = h.resolve(["a"], sel)
    assert plan.copy_rows.tolist() == [0, 1, 4, 9, 12]  # |D_r| = 5 copies, host order
    assert plan.counts.host_rows == 5 and plan.counts.host == 9
    assert plan.counts.staged_rows == 2
    assert h.hot_rows("a") == [0, 1, 4]
    base = h.group.staging.base_row
    assert plan.copy_dst.tolist()[3:] == [base, base + 1]
    loc = plan.locations[0]
    assert loc[0, 2] == loc[1, 0] == loc[2, 1]  # row 9: one location for every query
    assert plan.counts.host_bytes == 5 * 8 * h.layers
    h.check()


def test_staging_overflow_is_resource_exhausted_and_changes_nothing(device: str) -> None:
    h = host_request(device, open_rows=2, staging_rows=2)
    before = snapshot(h)
    with pytest.raises(ResourceExhausted, match="staging rows=4 > free staging rows=2"):
        h.resolve(["a"], [[[0, 1, 2, 3], [4, 5, 6, -1]]])
    assert_same(before, snapshot(h))
    h.resolve(["a"], [[[0, 1, 2, 3], [4, -1, -1, -1]]])  # 5 rows: 3 hot + 2 staged fit
    h.check()


def test_direct_lookup_skips_hot_cache_and_host(device: str) -> None:
    h = Harness(device, policy="adaptive")
    h.admit("a", 32, 10)  # pages 0-1 optional (ready), rows 8-9 in the tail
    h.open("a", 2)
    hot = h.group.request("a")
    plan = h.resolve(["a"], [[[0, 7, 9, 10], [11, 5, 8, -1]]])
    assert plan.direct.tolist() == [True]
    assert (plan.counts.tail, plan.counts.optional, plan.counts.hot) == (4, 3, 0)
    assert plan.counts.direct_lookups == 1 and plan.copy_rows.numel() == 0
    assert hot.hot_rows.tolist() == [-1, -1, -1] and hot.hot_stamp.tolist() == [0, 0, 0]
    assert plan.locations[0, 0, 1].item() == hot.page_map[1].item() * 4 + 3
    assert plan.locations[0, 0, 2].item() == hot.tail_locs[9 % 7].item()
    h.check()


def test_one_indirect_row_makes_the_lookup_go_through_the_hot_cache(device: str) -> None:
    h = Harness(device, policy="adaptive")
    h.admit("a", 32, 10)
    h.open("a", 1)
    backup(h.group, "a")
    assert retire(h.group, "a", [1]) == 1
    plan = h.resolve(["a"], [[[0, 5, 9]]])
    assert plan.direct.tolist() == [False]
    assert (plan.counts.optional, plan.counts.host, plan.counts.tail) == (1, 1, 1)
    assert h.hot_rows("a") == [5, -1, -1]
    h.check()


def test_follower_layers_share_one_resolution_and_copy_their_own_bytes(device: str) -> None:
    h = host_request(device, layers=3)
    sel = h.tensor([[[3, 1, 16]]])
    plan = resolve(h.group, ["a"], sel, h.causal_bounds(["a"], 1))
    assert h.group.pending_layers == {0, 1, 2}
    assert apply_copies(h.group, plan, 1) == 2 * 8
    pools = [h.group.payload(layer).cpu() for layer in range(3)]
    hot = plan.locations[0, 0, :2].cpu()
    assert torch.equal(pools[1][hot], h.truth[("a", 1)][[3, 1]])
    assert not torch.equal(pools[0][hot], h.truth[("a", 0)][[3, 1]])  # not applied yet
    with pytest.raises(FailedPrecondition, match="layers \\[0, 2\\]"):
        resolve(h.group, ["a"], sel, h.causal_bounds(["a"], 1))
    with pytest.raises(FailedPrecondition, match="not pending"):
        apply_copies(h.group, plan, 1)
    apply_copies(h.group, plan, 0)
    apply_copies(h.group, plan, 2)
    assert not h.group.pending_layers
    assert plan.counts.host_rows == 2 and plan.counts.host_bytes == 3 * 2 * 8
    assert not torch.equal(h.truth[("a", 0)], h.truth[("a", 1)])  # layers hold own bytes
    assert_exact(h.group, h.truth, plan, sel)
    h.check()


def test_shared_source_keeps_one_cache_state_across_consumers(device: str) -> None:
    h = host_request(device, layers=1)
    first = h.resolve(["a"], [[[0, 1, 2]]])  # consumer 1 (e.g. a Reuse chain reads this)
    second = h.resolve(["a"], [[[1, 2, 5]]])  # consumer 2 reindexes before 1 finished
    assert second.copy_rows.tolist() == [5]  # only the row absent from the shared state
    assert second.copy_dst.tolist() == [h.group.staging.base_row]  # slot 0 still protected
    assert second.locations[0, 0, :2].tolist() == first.locations[0, 0, 1:].tolist()
    h.group.readers_finished()
    assert release_staging(h.group) == 1
    assert h.hot_rows("a") == [5, 1, 2]
    third = h.resolve(["a"], [[[5, 1]]])
    assert third.copy_rows.numel() == 0 and third.counts.hot == 2
    h.check()


def test_batched_requests_resolve_independently_in_host_order(device: str) -> None:
    h = Harness(device, policy="hisparse")
    h.admit("a", 32, 16)
    h.admit("b", 32, 12)
    h.open("a", 2)
    h.open("b", 2)
    plan = h.resolve(["b", "a"], [[[11, 2, -1], [2, 12, 7]], [[9, 3, 16], [-1, -1, -1]]])
    assert plan.copy_batch.tolist() == [0, 0, 0, 1, 1]
    assert plan.copy_rows.tolist() == [2, 7, 11, 3, 9]
    assert plan.locations[1, 1].tolist() == [-1, -1, -1]
    assert h.hot_rows("b") == [2, 7, 11] and h.hot_rows("a") == [3, 9, -1]
    assert plan.direct.tolist() == [False, False]
    c = h.group.counters
    assert (c.tail, c.hot, c.host, c.host_rows, c.lookups) == (2, 0, 6, 5, 2)
    h.check()


def test_empty_batch_and_all_padding(device: str) -> None:
    h = host_request(device)
    plan = h.resolve([], torch.empty(0, 2, 3, dtype=torch.int64, device=h.group.device),
                     torch.empty(0, 2, dtype=torch.int64, device=h.group.device))
    assert plan.locations.shape == (0, 2, 3)
    plan = h.resolve(["a"], [[[-1, -1]]])
    assert plan.locations.tolist() == [[[-1, -1]]] and plan.direct.tolist() == [True]
    assert plan.counts.selected == 0


def test_readers_of_a_plan_cannot_finish_before_its_copies_land(device: str) -> None:
    """A fence while a plan's copies are pending in some layer is refused and changes
    nothing: those readers have not read, and a fence would let a backup, retire or open
    free slots the copies still land in. Once every layer is applied, it goes through."""
    h = host_request(device)
    sel = h.tensor([[[2, 0]]])
    plan = resolve(h.group, ["a"], sel, h.causal_bounds(["a"], 1))
    assert plan.copy_rows.numel() == 2
    apply_copies(h.group, plan, 0)
    before = snapshot(h)
    with pytest.raises(FailedPrecondition, match=rf"epoch={plan.epoch}: the plan of "
                       rf"epoch={plan.epoch} is not applied to payload layers \[1\]"):
        h.group.readers_finished()
    with pytest.raises(FailedPrecondition, match="apply_copies before its readers finish"):
        h.group.readers_finished(plan.epoch)
    assert_same(before, snapshot(h))
    h.group.readers_finished(plan.epoch - 1)  # earlier readers may finish
    apply_copies(h.group, plan, 1)
    assert_exact(h.group, h.truth, plan, sel)
    h.group.readers_finished()
    h.check()
