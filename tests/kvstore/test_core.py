"""The plain-Python core, in process: semantics, bad input, recovery, leases, capacity."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from services.kvstore.ranges import RangeSet
from services.kvstore.segments import segment_name
from services.kvstore.store import KVStore
from tests.kvstore.harness import (
    SHM,
    Clock,
    assert_no_segments,
    gated_allocation,
    options,
    segments,
)


def snapshot(s: KVStore) -> tuple:
    """Everything observable: stats, histories and their bytes."""
    return (s.stats(), sorted(s.histories(), key=lambda h: (h.request_id, h.source_id)),
            {(h.request_id, h.source_id): s.read(h.request_id, h.source_id, 0, h.num_rows)
             for h in s.histories()})


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=25))
@settings(max_examples=300, deadline=None)
def test_rangeset_matches_a_set_model(pairs: list[tuple[int, int]]) -> None:
    rs, model = RangeSet(), set()
    for a, b in pairs:
        rs.add(a, b)
        model |= set(range(a, b))
        runs = list(rs)
        assert all(x < y for x, y in runs)
        assert all(runs[i][1] < runs[i + 1][0] for i in range(len(runs) - 1))  # coalesced
        assert {r for x, y in runs for r in range(x, y)} == model
        assert rs.count() == len(model)
    for a in range(0, 62, 3):
        for b in range(a, 64, 5):
            assert rs.covers(a, b) == (set(range(a, b)) <= model)
            assert rs.intersects(a, b) == bool(set(range(a, b)) & model)


def test_round_trip_commit_and_segment_mode(store: KVStore, prefix: str) -> None:
    info, created = store.open("req-1", 3, "w0", 48, 10)
    assert created and info.backed == ()
    assert Path(info.segment_path).name == segment_name(prefix, "req-1", 3)
    assert os.stat(info.segment_path).st_mode & 0o777 == 0o600
    data = bytes(range(48)) * 4
    assert store.write("req-1", 3, "w0", 2, data) == (2, 6)
    assert store.commit("req-1", 3, "w0", [(2, 4), (4, 6)]) == ((2, 6),)
    assert store.read("req-1", 3, 2, 6, require_backed=True) == data
    assert [(a, len(b)) for a, b in store.read_chunks("req-1", 3, 2, 6, 100)] == [
        (2, 96), (4, 96)]
    with pytest.raises(FailedPrecondition):
        store.read("req-1", 3, 0, 6, require_backed=True)
    assert store.close_history("req-1", 3, "w0") == 4096
    assert_no_segments(prefix)


BAD_OPENS = [
    (dict(request_id=""), InvalidArgument),
    (dict(request_id="x" * 129), InvalidArgument),
    (dict(request_id="a/b"), InvalidArgument),
    (dict(request_id="é"), InvalidArgument),
    (dict(owner=""), InvalidArgument),
    (dict(source_id=-1), InvalidArgument),
    (dict(row_bytes=0), InvalidArgument),
    (dict(row_bytes=(4 << 20) + 1), InvalidArgument),
    (dict(num_rows=0), InvalidArgument),
    (dict(lease_seconds=-1.0), InvalidArgument),
    (dict(lease_seconds=float("nan")), InvalidArgument),
    (dict(num_rows=1 << 20), ResourceExhausted),
    (dict(request_id="held"), AlreadyExists),
    (dict(request_id="held", attach=True, owner="w1"), PermissionDenied),
    (dict(request_id="held", attach=True, num_rows=11), AlreadyExists),
]


@pytest.mark.parametrize(("change", "error"), BAD_OPENS)
def test_bad_open_changes_nothing(store: KVStore, change: dict, error: type) -> None:
    store.open("held", 0, "w0", 64, 10)
    store.write("held", 0, "w0", 0, b"\x07" * 640)
    store.commit("held", 0, "w0", [(0, 5)])
    before = snapshot(store)
    args = dict(request_id="r", source_id=0, owner="w0", row_bytes=64, num_rows=10)
    with pytest.raises(error):
        store.open(**{**args, **change})
    assert snapshot(store) == before


def test_bad_row_operations_change_nothing(store: KVStore) -> None:
    store.open("r", 0, "w0", 16, 8)
    store.write("r", 0, "w0", 0, b"\x01" * 16 * 4)
    store.commit("r", 0, "w0", [(0, 2)])
    before = snapshot(store)
    cases = [
        (lambda: store.write("r", 0, "w0", 0, b"\x02" * 16), FailedPrecondition),  # committed
        (lambda: store.write("r", 0, "w0", 7, b"\x02" * 32), InvalidArgument),  # past end
        (lambda: store.write("r", 0, "w0", 3, b"\x02" * 15), InvalidArgument),  # partial row
        (lambda: store.write("r", 0, "w0", 3, b""), InvalidArgument),
        (lambda: store.write("r", 0, "w1", 3, b"\x02" * 16), PermissionDenied),
        (lambda: store.write("r", 1, "w0", 3, b"\x02" * 16), NotFound),
        (lambda: store.write("r", 0, "w0", 2, b"\x02" * ((4 << 20) + 16)), InvalidArgument),
        (lambda: store.commit("r", 0, "w0", [(2, 4), (5, 9)]), InvalidArgument),  # atomic
        (lambda: store.commit("r", 0, "w0", [(3, 3)]), InvalidArgument),
        (lambda: store.commit("r", 0, "w0", []), InvalidArgument),
        (lambda: store.commit("r", 0, "w1", [(2, 4)]), PermissionDenied),
        (lambda: store.read("r", 0, 4, 2), InvalidArgument),
        (lambda: store.read("nope", 0, 0, 1), NotFound),
        (lambda: store.close_history("r", 0, "w1"), PermissionDenied),
        (lambda: store.close_history("r", 5, "w0"), NotFound),
        (lambda: store.renew("w0", [("r", 0), ("nope", 0)]), NotFound),
        (lambda: store.renew("w1", [("r", 0)]), PermissionDenied),
        (lambda: store.renew("w0", None, 1e9), InvalidArgument),
    ]
    for call, error in cases:
        with pytest.raises(error):
            call()
        assert snapshot(store) == before


def test_attach_returns_existing_history(store: KVStore, clock: Clock) -> None:
    info, _ = store.open("r", 0, "w0", 16, 8, lease_seconds=5)
    store.write("r", 0, "w0", 0, b"\x05" * 32)
    store.commit("r", 0, "w0", [(0, 2)])
    clock.now += 3
    again, created = store.open("r", 0, "w0", 16, 8, lease_seconds=5, attach=True)
    assert not created and again.backed == ((0, 2),)
    assert again.segment_path == info.segment_path
    assert again.lease_expires == clock.now + 5  # re-attach renews


def test_a_close_naming_an_earlier_opening_leaves_a_reattached_history(store: KVStore) -> None:
    """Each open that returns a history is a new opening; a close overtaken by a re-attach
    (it names the earlier opening) is refused and frees nothing, while streams keep their
    generation (a re-attach is the same history)."""
    first, _ = store.open("r", 0, "w0", 16, 8, attach=True)
    gen = store.generation("r", 0)
    store.write("r", 0, "w0", 0, b"\x05" * 32)
    store.commit("r", 0, "w0", [(0, 2)])
    again, created = store.open("r", 0, "w0", 16, 8, attach=True)
    assert not created and again.opening > first.opening > 0
    assert store.generation("r", 0) == gen
    with pytest.raises(NotFound, match="was opened again"):
        store.close_history("r", 0, "w0", opening=first.opening)
    assert store.info("r", 0).backed == ((0, 2),)  # nothing freed
    assert store.close_history("r", 0, "w0", opening=again.opening) > 0
    with pytest.raises(NotFound):
        store.info("r", 0)
    fresh, created = store.open("r", 0, "w0", 16, 8, attach=True)
    assert created and fresh.opening > again.opening
    assert store.close_history("r", 0, "w0") > 0  # no opening named: whatever the key holds


def test_recovery_after_crash_keeps_committed_rows(prefix: str, clock: Clock) -> None:
    crashed = KVStore(options(prefix), clock)
    crashed.open("a", 0, "w0", 32, 16)
    crashed.write("a", 0, "w0", 0, bytes(range(32)) * 16)
    crashed.commit("a", 0, "w0", [(0, 5), (9, 12)])
    crashed.open("b", 1, "w1", 8, 4)
    orphan = SHM / segment_name(prefix, "never-recorded", 0)  # crash between create/save
    orphan.write_bytes(b"x")
    # No shutdown: the store "dies"; a new one recovers from the manifest.
    again = KVStore(options(prefix), clock)
    assert again.stats().histories == 2 and again.stats().recovered_histories == 2
    assert again.info("a", 0).backed == ((0, 5), (9, 12))
    assert again.read("a", 0, 0, 16) == bytes(range(32)) * 16
    assert not orphan.exists()
    assert again.stats().used_bytes == crashed.stats().used_bytes
    # Recovered leases cannot run out before clients had a chance to renew.
    assert again.info("b", 1).lease_expires >= clock.now + again.options.default_lease_seconds
    again.close_history("a", 0, "w0")
    again.close_history("b", 1, "w1")
    assert_no_segments(prefix)


def test_openings_from_before_a_restart_close_recovered_histories_not_reattached_ones(
        prefix: str, clock: Clock) -> None:
    """A client's mapping from before a store restart names an opening of the old process:
    it still frees the recovered history, but not one re-attached after the restart (the new
    process's openings lie above every old one)."""
    crashed = KVStore(options(prefix), clock)
    a, _ = crashed.open("a", 0, "w0", 16, 8, attach=True)
    b, _ = crashed.open("b", 0, "w0", 16, 8, attach=True)
    again = KVStore(options(prefix), clock)  # the old store "dies" without shutdown
    assert again.close_history("a", 0, "w0", opening=a.opening) > 0  # recovered: freed
    b2, created = again.open("b", 0, "w0", 16, 8, attach=True)
    assert not created and b2.opening > b.opening
    with pytest.raises(NotFound, match="was opened again"):
        again.close_history("b", 0, "w0", opening=b.opening)
    again.close_history("b", 0, "w0", opening=b2.opening)
    assert_no_segments(prefix)


def test_open_token_tells_a_retried_open_that_it_created_the_history(
        prefix: str, clock: Clock) -> None:
    """A reply lost in a crash: the retry (same token, attach) learns the history is its own
    creation, also from a restarted store; any other token, or none, sees a re-attach."""
    s = KVStore(options(prefix), clock)
    _, created = s.open("t", 0, "w0", 16, 8, open_id="tok-1")
    assert created
    assert s.open("t", 0, "w0", 16, 8, attach=True, open_id="tok-1")[1]
    assert not s.open("t", 0, "w0", 16, 8, attach=True, open_id="tok-2")[1]
    assert not s.open("t", 0, "w0", 16, 8, attach=True)[1]
    again = KVStore(options(prefix), clock)  # no shutdown: the store "died" after saving
    assert again.open("t", 0, "w0", 16, 8, attach=True, open_id="tok-1")[1]
    assert not again.open("t", 0, "w0", 16, 8, attach=True, open_id="tok-2")[1]
    with pytest.raises(InvalidArgument, match="open_id has 129 characters; the limit is 128"):
        again.open("u", 0, "w0", 16, 8, open_id="x" * 129)
    assert again.stats().histories == 1
    again.close_history("t", 0, "w0")
    assert_no_segments(prefix)


def test_recovery_drops_records_without_segment(prefix: str, clock: Clock) -> None:
    s = KVStore(options(prefix), clock)
    info, _ = s.open("a", 0, "w0", 32, 16)
    os.unlink(info.segment_path)
    again = KVStore(options(prefix), clock)
    assert again.stats().histories == 0 and again.stats().used_bytes == 0
    assert_no_segments(prefix)


def test_a_slow_segment_allocation_holds_no_other_history(store: KVStore, clock: Clock,
                                                           prefix: str, monkeypatch) -> None:
    """A large open allocates its segment outside the store lock: another owner's renewal
    and a failed open of a third key are served meanwhile (a stalled renewal let live
    leases run out); its bytes are reserved against capacity; a retry of the same open
    waits for it and learns it created the history."""
    import threading

    store.open("other", 0, "w1", 64, 16)
    gate, entered = gated_allocation(monkeypatch)
    results: dict[str, object] = {}
    first = threading.Thread(target=lambda: results.setdefault(
        "first", store.open("big", 0, "w0", 64, 1024, open_id="t1")))
    first.start()
    assert entered.wait(10)
    assert store.renew("w1")[0] == 1  # served while the segment is being allocated
    free = store.options.capacity - store.stats().used_bytes
    with pytest.raises(ResourceExhausted, match="needs"):
        store.open("huge", 0, "w2", 64, free // 64 + 1)
    retry = threading.Thread(target=lambda: results.setdefault(
        "retry", store.open("big", 0, "w0", 64, 1024, attach=True, open_id="t1")))
    retry.start()
    retry.join(0.3)
    assert retry.is_alive() and "retry" not in results  # waits for the first open
    gate.set()
    first.join(10)
    retry.join(10)
    assert results["first"][1] and results["retry"][1]  # type: ignore[index]
    assert store.stats().histories == 2
    for rid, owner in (("big", "w0"), ("other", "w1")):
        store.close_history(rid, 0, owner)
    assert store.stats().used_bytes == 0
    assert_no_segments(prefix)


def test_capacity_exhaustion_then_recovery_after_close(prefix: str, clock: Clock) -> None:
    s = KVStore(options(prefix, capacity=64 * 4096), clock)
    for i in range(4):
        s.open(f"r{i}", 0, "w0", 4096, 16)
    with pytest.raises(ResourceExhausted, match="capacity=262144"):
        s.open("r4", 0, "w0", 4096, 1)
    s.close_history("r1", 0, "w0")
    s.open("r4", 0, "w0", 4096, 16)
    assert s.stats().used_bytes == s.stats().capacity_bytes
    assert len(segments(prefix)) == 4


def test_renewed_leases_survive_a_restart(prefix: str, clock: Clock) -> None:
    """A renewal (or a re-attach) past the lease granted at open reaches the manifest: a
    store restarted before the renewed deadline keeps the history until then."""
    s = KVStore(options(prefix, max_lease_seconds=7200), clock)
    s.open("a", 0, "w0", 16, 4, lease_seconds=3600)
    s.write("a", 0, "w0", 0, b"\x07" * 64)
    s.commit("a", 0, "w0", [(0, 4)])
    s.open("b", 0, "w0", 16, 4, lease_seconds=3600)
    clock.now += 3000
    s.renew("w0", [("a", 0)], lease_seconds=3600)  # a: to t0 + 6600
    s.open("b", 0, "w0", 16, 4, lease_seconds=3600, attach=True)  # b: to t0 + 6600
    clock.now += 1000  # the store dies at t0 + 4000, past the lease granted at open
    again = KVStore(options(prefix, max_lease_seconds=7200), clock)
    for key in (("a", 0), ("b", 0)):
        assert again.info(*key).lease_expires == 1000.0 + 6600
    clock.now += 2000  # t0 + 6000: within the renewed lease
    assert again.expire() == []
    assert again.read("a", 0, 0, 4, require_backed=True) == b"\x07" * 64
    clock.now += 601
    assert sorted(again.expire()) == [("a", 0), ("b", 0)]
    assert_no_segments(prefix)


def test_default_length_renewals_write_no_manifest_record(store: KVStore, clock: Clock,
                                                          monkeypatch) -> None:
    """A restart grants every recovered history restart time + default_lease_seconds, so a
    renewal by the default lease (the periodic one) needs no fsync'd record; only a lease
    beyond that floor is written."""
    store.open("a", 0, "w0", 16, 4)
    saves = []
    saved = store._manifest.save
    monkeypatch.setattr(store._manifest, "save", lambda r: (saves.append(r), saved(r)))
    for _ in range(3):
        clock.now += 30
        store.renew("w0")
    assert saves == []
    store.renew("w0", lease_seconds=600)
    assert [r.lease_expires for r in saves] == [clock.now + 600]


def test_a_failed_lease_write_changes_no_lease(store: KVStore, clock: Clock, monkeypatch) -> None:
    store.open("a", 0, "w0", 16, 4, lease_seconds=10)
    store.open("b", 0, "w0", 16, 4, lease_seconds=10)
    before = snapshot(store)
    saved = store._manifest.save
    calls = []

    def flaky(record):  # the second record's write fails
        calls.append(record.request_id)
        if len(calls) == 2:
            raise OSError(5, "EIO")
        saved(record)

    monkeypatch.setattr(store._manifest, "save", flaky)
    with pytest.raises(OSError):
        store.renew("w0", lease_seconds=600)  # beyond the default: written durably
    monkeypatch.setattr(store._manifest, "save", saved)
    assert snapshot(store) == before
    clock.now += 11
    assert sorted(store.expire()) == [("a", 0), ("b", 0)]


def test_expiry_that_fails_midway_leaves_the_rest_due(store: KVStore, clock: Clock,
                                                       monkeypatch) -> None:
    for rid in ("a", "b", "c"):
        store.open(rid, 0, "w0", 16, 4, lease_seconds=5)
    clock.now += 6
    removed = store._manifest.remove

    def failing(segment):
        raise OSError(5, "EIO")

    monkeypatch.setattr(store._manifest, "remove", failing)
    with pytest.raises(OSError):
        store.expire()
    assert store.stats().histories == 3 and store.stats().lease_expiries_total == 0
    assert len(store.histories("w0")) == 3  # every history still has its lease entry
    monkeypatch.setattr(store._manifest, "remove", removed)
    assert sorted(store.expire()) == [("a", 0), ("b", 0), ("c", 0)]
    assert store.stats().used_bytes == 0 and store.stats().lease_expiries_total == 3


def test_owner_operations_after_the_deadline_find_the_history_gone(store: KVStore,
                                                                   clock: Clock) -> None:
    """Past its deadline a history is freed on the owner's next call, before the sweeper:
    a commit then cannot report rows backed that the sweep frees a moment later."""
    store.open("a", 0, "w0", 16, 4, lease_seconds=10)
    store.write("a", 0, "w0", 0, b"\x01" * 16)
    clock.now += 10
    with pytest.raises(NotFound, match="lease expired"):
        store.commit("a", 0, "w0", [(0, 1)])
    assert store.stats().histories == 0 and store.stats().lease_expiries_total == 1
    with pytest.raises(NotFound):
        store.renew("w0", [("a", 0)])


def test_a_client_abandoning_a_read_stream_is_counted_cancelled(store: KVStore) -> None:
    """A reader that stops consuming ReadRows (the stream's generator is closed) is a
    cancellation, not an INTERNAL server error, in the RPC metrics."""
    import asyncio

    from services.common.gen.dhisparse.v1 import kvstore_pb2 as pb
    from services.kvstore.metrics import KVStoreMetrics
    from services.kvstore.servicer import KVStoreServicer

    store.open("a", 0, "w0", 16, 64)
    metrics = KVStoreMetrics(store)
    servicer = KVStoreServicer(store, metrics)
    request = pb.ReadRowsRequest(key=pb.HistoryKey(request_id="a", source_id=0),
                                 range=pb.RowRange(start=0, stop=64), max_chunk_bytes=128)

    async def read_one_chunk() -> None:
        stream = servicer.ReadRows(request, None)
        await stream.__anext__()
        await stream.aclose()

    asyncio.run(read_one_chunk())
    value = metrics.registry.get_sample_value
    assert value("dhisparse_kvstore_rpc_errors_total",
                 {"method": "ReadRows", "code": "CANCELLED"}) == 1
    assert value("dhisparse_kvstore_rpc_errors_total",
                 {"method": "ReadRows", "code": "INTERNAL"}) is None


def test_streams_refuse_a_history_recreated_under_their_key(store: KVStore,
                                                             clock: Clock) -> None:
    """A WriteRows / ReadRows stream that outlives its history (lease expired, the owner
    opened the key again) fails instead of committing rows it never wrote to the new
    history, or mixing the old history's bytes with the new one's."""
    import asyncio

    from services.common.gen.dhisparse.v1 import kvstore_pb2 as pb
    from services.kvstore.metrics import KVStoreMetrics
    from services.kvstore.servicer import KVStoreServicer

    servicer = KVStoreServicer(store, KVStoreMetrics(store))
    key = pb.HistoryKey(request_id="a", source_id=0)
    store.open("a", 0, "w0", 16, 8, lease_seconds=10)

    def recreate() -> None:
        clock.now += 11
        store.expire()
        store.open("a", 0, "w0", 16, 8, lease_seconds=10, attach=True)

    async def chunks():
        yield pb.WriteRowsChunk(key=key, owner="w0", first_row=0, data=b"\x01" * 64)
        recreate()
        yield pb.WriteRowsChunk(first_row=4, data=b"\x02" * 64, commit=True)

    with pytest.raises(NotFound, match="freed and opened again"):
        asyncio.run(servicer.WriteRows(chunks(), None))
    assert store.info("a", 0).backed == ()  # nothing of the old stream committed

    store.write("a", 0, "w0", 0, b"\x03" * 128)
    store.commit("a", 0, "w0", [(0, 8)])
    request = pb.ReadRowsRequest(key=key, range=pb.RowRange(start=0, stop=8),
                                 max_chunk_bytes=64)

    async def read_across_recreation() -> None:
        stream = servicer.ReadRows(request, None)
        assert (await stream.__anext__()).data == b"\x03" * 64
        recreate()
        await stream.__anext__()

    with pytest.raises(NotFound, match="freed and opened again"):
        asyncio.run(read_across_recreation())
