"""Process-level scenarios: kill -9 mid-workload, lease expiry, capacity, 16 clients."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch

from services.common.errors import DHiSparseError, NotFound, ResourceExhausted, Unavailable
from services.kvstore.client import KVStoreClient
from services.kvstore.ranges import RangeSet
from services.kvstore.rpc import KVStoreRPC
from tests.kvstore.harness import StoreProcess, assert_no_segments, segments

pytestmark = pytest.mark.integration
ROW = 64


def pattern(start: int, stop: int, salt: int) -> torch.Tensor:
    """Deterministic rows: row i is bytes (i*7 + j + salt) mod 256."""
    i = torch.arange(start, stop).unsqueeze(1)
    j = torch.arange(ROW).unsqueeze(0)
    return ((i * 7 + j + salt) % 256).to(torch.uint8)


class Writer(threading.Thread):
    """Writes batches; commits two of every three; records what the store acknowledged."""

    def __init__(self, write, commit, batch: int, limit: int) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.write, self.commit, self.batch, self.limit = write, commit, batch, limit
        self.acked, self.uncommitted = RangeSet(), RangeSet()
        self.in_flight: tuple[int, int] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        for k, start in enumerate(range(0, self.limit, self.batch)):
            stop = start + self.batch
            try:
                if k % 3 == 2:
                    self.write(start, stop, False)
                    self.uncommitted.add(start, stop)
                    continue
                self.in_flight = (start, stop)
                self.commit(start, stop)
                self.acked.add(start, stop)
                self.in_flight = None
            except DHiSparseError as e:
                self.error = e
                return


def test_kill9_during_writes_loses_no_committed_row(prefix: str, tmp_path: Path) -> None:
    store = StoreProcess(prefix, tmp_path).start()
    n = 60_000
    client = KVStoreClient(store.target, "w0", register_cuda=False, timeout=2.0)
    rpc = client.rpc
    h = client.open("mapped", 0, ROW, n)
    rpc.open("streamed", 0, "w0", ROW, n)

    def mapped_write(a: int, b: int, commit: bool) -> None:
        h.write(a, pattern(a, b, 1))
        if commit:
            h.commit(a, b)

    def streamed_write(a: int, b: int, commit: bool) -> None:
        rpc.write_rows("streamed", 0, "w0", a, pattern(a, b, 2).numpy().tobytes(), ROW,
                       commit=commit)

    writers = [Writer(mapped_write, lambda a, b: mapped_write(a, b, True), 16, n),
               Writer(streamed_write, lambda a, b: streamed_write(a, b, True), 16, n)]
    for w in writers:
        w.start()
    time.sleep(0.6)
    store.kill9()
    for w in writers:
        w.join(timeout=30)
        assert isinstance(w.error, Unavailable), w.error
        assert w.acked.count() > 100 and w.uncommitted.count() > 0
    # The store is down: the live mapping still reads and writes.
    acked = writers[0].acked
    for a, b in acked:
        assert torch.equal(h.rows()[a:b], pattern(a, b, 1))
    h.write(n - 16, pattern(n - 16, n, 9))
    assert torch.equal(h.rows()[n - 16:], pattern(n - 16, n, 9))
    with pytest.raises(Unavailable):
        h.commit(n - 16, n)

    store.start()
    rpc.wait_ready()
    openings: dict[str, int] = {}
    for name, w, salt in (("mapped", writers[0], 1), ("streamed", writers[1], 2)):
        again = client.rpc.open(name, 0, "w0", ROW, n, attach=True)
        assert again.attached
        openings[name] = again.history.opening
        backed = RangeSet((r.start, r.stop) for r in again.history.backed)
        allowed = w.acked.copy()
        if w.in_flight:
            allowed.add(*w.in_flight)
        for a, b in w.acked:
            assert backed.covers(a, b), (name, a, b)
        for a, b in backed:
            assert allowed.covers(a, b), (name, a, b)  # nothing uncommitted became backed
        for a, b in w.uncommitted:
            assert not backed.intersects(a, b)
        data = rpc.read_rows(name, 0, 0, n)
        got = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(n, ROW)
        for a, b in backed:
            assert torch.equal(got[a:b], pattern(a, b, salt)), (name, a, b)
    # the re-attaches above hold both now; the client's mapping is of an opening from
    # before the restart, so its close is refused (and unmaps)
    rpc.close("mapped", 0, "w0", opening=openings["mapped"])
    with pytest.raises(NotFound):
        client.close("mapped", 0)
    rpc.close("streamed", 0, "w0", opening=openings["streamed"])
    client.shutdown()
    assert store.stop() == 0
    assert_no_segments(prefix)


def test_lease_expiry_frees_memory(prefix: str, tmp_path: Path) -> None:
    store = StoreProcess(prefix, tmp_path, "--expiry-interval-seconds", "0.05").start()
    try:
        keeper = KVStoreClient(store.target, "keeper", lease_seconds=0.6, register_cuda=False)
        kept = keeper.open("kept", 0, 4096, 16)
        rpc = KVStoreRPC(store.target)
        rpc.open("lapsed", 0, "gone", 4096, 16, lease_seconds=0.3)
        lapsed = KVStoreClient(store.target, "gone", lease_seconds=0.3, register_cuda=False,
                                renew=False)
        view = lapsed.open("lapsed", 0, 4096, 16)
        view.write(0, pattern(0, 16, 3).repeat(1, 64))
        assert len(segments(prefix)) == 2
        time.sleep(1.5)
        stats = rpc.stats(include_histories=True)
        assert [h.key.request_id for h in stats.history] == ["kept"]
        assert stats.lease_expiries == 1 and stats.used_bytes == 16 * 4096
        assert len(segments(prefix)) == 1  # the lapsed segment's memory is returned
        # A mapping outlives the lease of its history (the pages go with the unmap).
        assert torch.equal(view.rows(), pattern(0, 16, 3).repeat(1, 64))
        lapsed.shutdown()
        kept.commit(0, 1)
        keeper.close("kept", 0)
        keeper.shutdown()
        assert_no_segments(prefix)
    finally:
        assert store.stop() == 0


def test_capacity_exhaustion_then_recovery(prefix: str, tmp_path: Path) -> None:
    store = StoreProcess(prefix, tmp_path, capacity="1MiB").start()
    try:
        rpc = KVStoreRPC(store.target)
        for i in range(4):
            rpc.open(f"cap-{i}", 0, "w0", 4096, 64)
        with pytest.raises(ResourceExhausted, match="capacity=1048576"):
            rpc.open("cap-4", 0, "w0", 4096, 64)
        assert rpc.stats().histories == 4
        rpc.close("cap-2", 0, "w0")
        rpc.open("cap-4", 0, "w0", 4096, 64)
        for i in (0, 1, 3, 4):
            rpc.close(f"cap-{i}", 0, "w0")
        assert rpc.stats().used_bytes == 0
        assert_no_segments(prefix)
    finally:
        assert store.stop() == 0


def test_16_concurrent_clients_disjoint_and_shared(prefix: str, tmp_path: Path) -> None:
    store = StoreProcess(prefix, tmp_path).start()
    n_clients, rows, slice_rows = 16, 512, 32
    owner_rpc = KVStoreRPC(store.target)
    for s in range(2):
        owner_rpc.open("shared", s, "team", ROW, n_clients * slice_rows)
    barrier = threading.Barrier(n_clients)
    failures: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with KVStoreClient(store.target, f"w{i}", register_cuda=False, renew=False) as own, \
                    KVStoreClient(store.target, "team", register_cuda=False, renew=False) as team:
                mine = own.open(f"solo-{i}", 0, ROW, rows)
                for a in range(0, rows // 2, 64):
                    mine.write(a, pattern(a, a + 64, i))
                    mine.commit(a, a + 64)
                own.rpc.write_rows(f"solo-{i}", 0, f"w{i}", rows // 2, pattern(
                    rows // 2, rows, i).numpy().tobytes(), ROW, commit=True)
                a, b = i * slice_rows, (i + 1) * slice_rows
                shared = [team.open("shared", s, ROW, n_clients * slice_rows) for s in range(2)]
                shared[0].write(a, pattern(a, b, 100))
                shared[0].commit(a, b)
                team.rpc.write_rows("shared", 1, "team", a, pattern(a, b, 200).numpy().tobytes(),
                                    ROW, commit=True)
                barrier.wait(timeout=60)
                got = own.rpc.read_rows(f"solo-{i}", 0, 0, rows, require_backed=True)
                assert got == pattern(0, rows, i).numpy().tobytes(), f"solo-{i}"
                for s, salt in ((0, 100), (1, 200)):
                    whole = pattern(0, n_clients * slice_rows, salt)
                    assert torch.equal(shared[s].rows(), whole), f"shared/{s} mapped"
                    assert team.rpc.read_rows("shared", s, 0, n_clients * slice_rows,
                                              require_backed=True) == whole.numpy().tobytes()
                own.close(f"solo-{i}", 0)
        except BaseException as e:  # reported below with the client's number
            failures.append(e)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures
    for s in range(2):
        owner_rpc.close("shared", s, "team")
    assert owner_rpc.stats().used_bytes == 0
    assert store.stop() == 0
    assert_no_segments(prefix)
    assert os.path.exists(store.log)
