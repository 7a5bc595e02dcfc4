"""Leases: the LeaseTable against a dict model and its bounded heap; the store's expiry
(a lease run out is gone for every call; an unfreeable history fails only its own)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.kvstore.leases import STALE_MARGIN, LeaseTable
from services.kvstore.store import KVStore
from tests.kvstore.harness import Clock, assert_no_segments

OPS = st.lists(st.tuples(st.sampled_from(["renew", "drop", "expire"]), st.integers(0, 7),
                         st.integers(0, 50)), max_size=300)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_expiry_matches_a_dict_model(ops: list[tuple[str, int, int]]) -> None:
    table, model = LeaseTable(), {}
    for op, key, t in ops:
        if op == "renew":
            table.renew(key, float(t))
            model[key] = float(t)
        elif op == "drop":
            table.drop(key)
            model.pop(key, None)
        else:
            due = table.pop_expired(float(t))
            want = sorted((d, k) for k, d in model.items() if d <= t)
            assert sorted((model[k], k) for k in due) == want
            for k in due:
                del model[k]
        assert len(table) == len(model)
        assert all(table.deadline(k) == d for k, d in model.items())


def test_a_renew_loop_keeps_the_heap_bounded() -> None:
    """Every renew pushes an entry; the stale ones are rebuilt away, not kept until their
    deadlines (a client renewing every second for an hour-long lease)."""
    table = LeaseTable()
    for i in range(20_000):
        table.renew("a", 3600.0 + i)
        table.renew(("b", i % 3), 7200.0 + i)
        assert len(table._heap) <= 2 * len(table) + STALE_MARGIN + 1
    for i in range(3):
        table.drop(("b", i))
    assert table.pop_expired(3600.0 + 19_998) == []
    assert table.pop_expired(3600.0 + 19_999) == ["a"] and len(table) == 0


def test_lease_expiry_frees_memory(store: KVStore, clock: Clock, prefix: str) -> None:
    store.open("short", 0, "w0", 64, 64, lease_seconds=2)
    store.open("long", 0, "w1", 64, 64, lease_seconds=10)
    clock.now += 1
    assert store.renew("w0") == (1, clock.now + store.options.default_lease_seconds)
    store.renew("w0", [("short", 0)], lease_seconds=2)  # never shortens a lease
    clock.now += 30
    assert store.expire() == [("long", 0)]
    assert store.stats().histories == 1 and store.stats().lease_expiries_total == 1
    clock.now += 60
    assert store.expire() == [("short", 0)]
    assert store.stats().used_bytes == 0
    assert_no_segments(prefix)


def test_a_lease_run_out_is_never_extended_again(store: KVStore, clock: Clock,
                                                 prefix: str) -> None:
    """Out of lease and not yet swept, a history is gone for every call alike: a renewal
    of all the owner's histories skips it, an attach-open creates a fresh one (as write,
    commit and renew by key refuse it)."""
    store.open("a", 0, "w0", 64, 16, lease_seconds=10)
    store.open("b", 0, "w0", 64, 16, lease_seconds=10)
    store.open("c", 0, "w0", 64, 16, lease_seconds=100)
    clock.now += 11
    assert store.renew("w0")[0] == 1  # c only: a and b are left to the sweep
    assert sorted(k[0] for k in store.expire()) == ["a", "b"]
    assert sorted(h.request_id for h in store.histories()) == ["c"]
    store.open("d", 0, "w0", 64, 16, lease_seconds=10)
    clock.now += 11
    _, created = store.open("d", 0, "w0", 64, 16, attach=True)
    assert created and store.stats().lease_expiries_total == 3
    for rid in ("c", "d"):
        store.close_history(rid, 0, "w0")
    assert_no_segments(prefix)


def test_a_history_that_cannot_be_freed_fails_only_its_own_calls(
        store: KVStore, clock: Clock, monkeypatch) -> None:
    """An expired history whose free fails (the manifest's disk) stays due for the sweep;
    opens of other keys and renewals of other histories go on."""
    store.open("a", 0, "w0", 64, 16, lease_seconds=10)
    store.open("b", 0, "w1", 64, 16, lease_seconds=100)
    seg_a = store.info("a", 0).segment_path.rsplit("/", 1)[-1]
    remove = store._manifest.remove

    def failing_remove(segment: str) -> None:
        if segment == seg_a:
            raise OSError(5, "EIO (test)")
        remove(segment)

    monkeypatch.setattr(store._manifest, "remove", failing_remove)
    clock.now += 11
    with pytest.raises(OSError):
        store.expire()
    store.open("c", 0, "w1", 64, 16)
    assert store.renew("w1")[0] == 2 and store.renew("w0")[0] == 0
    monkeypatch.setattr(store._manifest, "remove", remove)
    assert store.expire() == [("a", 0)]
    for rid in ("b", "c"):
        store.close_history(rid, 0, "w1")
