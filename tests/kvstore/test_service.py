"""One real kvstore process: exact round trips through both paths, status codes for bad
input with nothing changed, metrics, bearer token, restart after SIGTERM."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from services.common.errors import NotFound
from services.common.gen.dhisparse.v1 import kvstore_pb2 as pb
from services.kvstore.client import KVStoreClient
from services.kvstore.rpc import KVStoreRPC
from tests.kvstore.harness import (
    StoreProcess,
    assert_no_segments,
    free_port,
    remove_store_files,
    unique_prefix,
)

CHUNK = 64 << 10
OWNER = "worker-0"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreProcess]:
    prefix = unique_prefix("svc")
    proc = StoreProcess(prefix, tmp_path_factory.mktemp("svc"), "--max-chunk-bytes",
                        str(CHUNK), "--metrics-port", str(free_port()), capacity="64MiB")
    proc.start()
    yield proc
    assert proc.stop() == 0
    remove_store_files(prefix)


@pytest.fixture
def rpc(server: StoreProcess) -> Iterator[KVStoreRPC]:
    r = KVStoreRPC(server.target)
    yield r
    for h in r.stats(include_histories=True).history:  # tests leave nothing behind
        r.close(h.key.request_id, h.key.source_id, h.owner)
    r.close_channel()
    assert_no_segments(server.prefix)


def random_rows(n: int, row_bytes: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, row_bytes), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize(("row_bytes", "num_rows"), [(1, 7), (656, 431), (4096, 123),
                                                      (CHUNK, 3), (6, 42_000)])
def test_grpc_round_trip_is_exact(rpc: KVStoreRPC, row_bytes: int, num_rows: int) -> None:
    rid = f"rt-{row_bytes}-{num_rows}"
    resp = rpc.open(rid, 2, OWNER, row_bytes, num_rows)
    assert resp.max_chunk_bytes == CHUNK and not resp.attached
    rows = random_rows(num_rows, row_bytes, seed=row_bytes).numpy().tobytes()
    w = rpc.write_rows(rid, 2, OWNER, 0, rows, row_bytes, CHUNK, commit=True)
    assert (w.rows_written, w.bytes_written) == (num_rows, len(rows))
    assert [(r.start, r.stop) for r in w.backed] == [(0, num_rows)]
    assert rpc.read_rows(rid, 2, 0, num_rows, require_backed=True) == rows
    mid = num_rows // 2
    assert rpc.read_rows(rid, 2, mid, num_rows, max_chunk_bytes=1000) == rows[mid * row_bytes:]


def test_mapped_and_grpc_paths_see_the_same_bytes(server: StoreProcess, rpc: KVStoreRPC) -> None:
    with KVStoreClient(server.target, OWNER, register_cuda=False) as client:
        h = client.open("mapped", 0, 656, 300)
        assert h.created  # this open made it (a failed admission may free it)
        view = h.rows()
        assert view.shape == (300, 656) and view.dtype == torch.uint8
        rows = random_rows(200, 656, seed=1)
        h.write(0, rows)
        assert not h.backed_mask().any()
        h.commit(0, 100)
        h.commit(150, 200)
        assert h.backed_mask().tolist() == [True] * 100 + [False] * 50 + [True] * 50 + [
            False] * 100
        assert rpc.read_rows("mapped", 0, 0, 200) == rows.numpy().tobytes()
        # gRPC writes land in the same pages the worker has mapped (zero-copy view).
        more = random_rows(100, 656, seed=2)
        rpc.write_rows("mapped", 0, OWNER, 200, more.numpy().tobytes(), 656, CHUNK, commit=True)
        assert torch.equal(view[200:], more)
        h.refresh()
        assert h.backed_mask()[200:].all() and not h.backed_mask()[100:150].any()
        # A second open of the same key re-attaches the same mapping.
        assert client.open("mapped", 0, 656, 300) is h and not h.created
        # A new client of the same owner (a restarted worker) re-attaches through the store.
        with KVStoreClient(server.target, OWNER, register_cuda=False) as other:
            assert not other.open("mapped", 0, 656, 300).created
        # ... and holds it from then on: the first client's close names its own, earlier
        # opening and is refused (it still unmaps); the restarted worker's opening frees it
        with pytest.raises(NotFound, match="opened again"):
            client.close("mapped", 0)
        assert h.closed
        rpc.close("mapped", 0, OWNER)


def test_open_token_travels_over_grpc(rpc: KVStoreRPC) -> None:
    assert not rpc.open("tok", 0, OWNER, 16, 4, attach=True, open_id="t-1").attached
    assert not rpc.open("tok", 0, OWNER, 16, 4, attach=True, open_id="t-1").attached  # retry
    assert rpc.open("tok", 0, OWNER, 16, 4, attach=True, open_id="t-2").attached
    rpc.close("tok", 0, OWNER)


def test_a_second_open_with_another_shape_is_refused(server: StoreProcess) -> None:
    from services.common.errors import AlreadyExists

    with KVStoreClient(server.target, OWNER, register_cuda=False) as client:
        client.open("shape", 0, 16, 8)
        with pytest.raises(AlreadyExists, match="row_bytes=16, num_rows=8; asked for row_bytes=32"):
            client.open("shape", 0, 32, 100)
        client.close("shape", 0)


def test_close_of_a_history_freed_meanwhile_still_unmaps(server: StoreProcess,
                                                        rpc: KVStoreRPC) -> None:
    with KVStoreClient(server.target, OWNER, register_cuda=False) as client:
        h = client.open("gone", 0, 656, 8)
        rpc.close("gone", 0, OWNER)  # freed in the store (as an expired lease would be)
        with pytest.raises(NotFound):
            client.close("gone", 0)
        assert h.closed  # the mapping does not outlive the history


def test_a_close_without_an_answer_unmaps_so_a_reopen_asks_the_store(
        server: StoreProcess, rpc: KVStoreRPC, monkeypatch) -> None:
    """A close that timed out may have gone through: the mapping goes with it, so a later
    open of the key asks the store (a fresh history here) instead of handing out the
    mapping of a freed one."""
    from services.common.errors import DeadlineExceeded

    with KVStoreClient(server.target, OWNER, register_cuda=False) as client:
        h = client.open("late", 0, 656, 8)
        real = client.rpc.close

        def late_close(*a, **kw):
            real(*a, **kw)  # the store closes it; the answer comes too late
            raise DeadlineExceeded("kvstore did not answer in time (test)")

        monkeypatch.setattr(client.rpc, "close", late_close)
        with pytest.raises(DeadlineExceeded):
            client.close("late", 0)
        monkeypatch.setattr(client.rpc, "close", real)
        assert h.closed
        again = client.open("late", 0, 656, 8)
        assert again is not h and again.created
        client.close("late", 0)


def test_a_close_overtaken_by_a_reopen_of_the_key_leaves_the_reopened_history(
        server: StoreProcess, rpc: KVStoreRPC, monkeypatch) -> None:
    """A close still on its way when the key is opened again: the open re-attaches first
    (the mapping already left the client's table, so the open asks the store), then the
    close arrives naming the earlier opening and is refused; the re-opened history and its
    committed rows stay, and its own close frees it."""
    with KVStoreClient(server.target, OWNER, register_cuda=False) as client:
        h = client.open("again", 0, 16, 8)
        h.write(0, torch.full((2, 16), 7, dtype=torch.uint8))
        h.commit(0, 2)
        real, reopened = client.rpc.close, []

        def overtaken_close(*a, **kw):
            reopened.append(client.open("again", 0, 16, 8))  # reaches the store first
            return real(*a, **kw)

        monkeypatch.setattr(client.rpc, "close", overtaken_close)
        with pytest.raises(NotFound, match=r"was opened again .* which this close names"):
            client.close("again", 0)
        monkeypatch.setattr(client.rpc, "close", real)
        again = reopened[0]
        assert h.closed and again is not h and not again.created  # re-attached, not new
        assert again.opening > h.opening and not again.closed
        assert again.backed_mask()[:2].all() and bool((again.rows()[:2] == 7).all())
        with pytest.raises(NotFound, match="opened again"):  # the stale opening, by hand
            rpc.close("again", 0, OWNER, opening=h.opening)
        client.close("again", 0)  # the current opening frees it
    keys = {(x.key.request_id, x.key.source_id) for x in rpc.stats(include_histories=True).history}
    assert ("again", 0) not in keys


@pytest.mark.parametrize("raced", [False, True])
def test_open_whose_mapping_fails_frees_what_it_created(
        server: StoreProcess, rpc: KVStoreRPC, monkeypatch: pytest.MonkeyPatch,
        raced: bool) -> None:
    """The store created the history but this process could not map it: the client frees it
    (no caller holds it, and the owner's lease renewals would keep it for good). The
    clean-up close names that open's opening: a re-attach of the key by another caller in
    between (``raced``) keeps its history."""
    import services.kvstore.client as client_mod

    def unmappable(*args, **kwargs):
        if raced:
            rpc.open("unmapped", 0, OWNER, 656, 8, attach=True)  # another thread, meanwhile
        raise OSError("mmap failed")

    with KVStoreClient(server.target, OWNER, register_cuda=False) as client:
        monkeypatch.setattr(client_mod, "MappedHistory", unmappable)
        with pytest.raises(OSError, match="mmap failed"):
            client.open("unmapped", 0, 656, 8)
    keys = {(h.key.request_id, h.key.source_id) for h in rpc.stats(include_histories=True).history}
    assert (("unmapped", 0) in keys) == raced
    if raced:
        rpc.close("unmapped", 0, OWNER)


def test_of_two_concurrent_opens_the_table_keeps_the_later_opening(
        server: StoreProcess, rpc: KVStoreRPC, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two opens of one key both re-attach through the store; whichever answer comes back
    last, the client keeps the later opening (the one its close must name) and hands it to
    both callers."""
    with KVStoreClient(server.target, OWNER, register_cuda=False) as client:
        client.rpc.open("twice", 0, OWNER, 16, 8, attach=True)  # exists, not mapped here
        real, inner = client.rpc.open, []

        def overtaken_open(*a, **kw):
            resp = real(*a, **kw)  # the earlier opening ...
            monkeypatch.setattr(client.rpc, "open", real)
            inner.append(client.open("twice", 0, 16, 8))  # ... answered after a later one
            return resp

        monkeypatch.setattr(client.rpc, "open", overtaken_open)
        outer = client.open("twice", 0, 16, 8)
        assert outer is inner[0] and not outer.closed and not outer.created
        assert client.opening_of("twice", 0) == outer.opening
        client.close("twice", 0)  # names the later opening: freed
    keys = {(h.key.request_id, h.key.source_id) for h in rpc.stats(include_histories=True).history}
    assert ("twice", 0) not in keys


def grpc_code(fn, *args, **kw) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception) as info:
        fn(*args, **kw)
    return info.value.grpc_code  # type: ignore[attr-defined]


def state(rpc: KVStoreRPC) -> tuple:
    stats = rpc.stats(include_histories=True)
    hist = sorted(h.SerializeToString(deterministic=True) for h in stats.history)
    data = {(h.key.request_id, h.key.source_id): rpc.read_rows(h.key.request_id,
                                                               h.key.source_id, 0, h.num_rows)
            for h in stats.history}
    return stats.used_bytes, stats.histories, hist, data


def test_bad_input_gets_the_right_code_and_changes_nothing(rpc: KVStoreRPC) -> None:
    rpc.open("bad", 0, OWNER, 16, 8, lease_seconds=600)
    rpc.write_rows("bad", 0, OWNER, 0, b"\x09" * 64, 16, commit=True)
    before = state(rpc)
    C = grpc.StatusCode
    cases = [
        (C.INVALID_ARGUMENT, rpc.open, ("", 0, OWNER, 16, 8)),
        (C.INVALID_ARGUMENT, rpc.open, ("bad id", 0, OWNER, 16, 8)),
        (C.INVALID_ARGUMENT, rpc.open, ("r" * 129, 0, OWNER, 16, 8)),
        (C.INVALID_ARGUMENT, rpc.open, ("ok", 0, "", 16, 8)),
        (C.INVALID_ARGUMENT, rpc.open, ("ok", 0, OWNER, 0, 8)),
        (C.INVALID_ARGUMENT, rpc.open, ("ok", 0, OWNER, CHUNK + 1, 8)),
        (C.RESOURCE_EXHAUSTED, rpc.open, ("ok", 0, OWNER, 4096, 1 << 20)),
        (C.ALREADY_EXISTS, rpc.open, ("bad", 0, OWNER, 16, 8)),
        (C.ALREADY_EXISTS, rpc.open, ("bad", 0, OWNER, 32, 8, 0.0, True)),
        (C.PERMISSION_DENIED, rpc.open, ("bad", 0, "intruder", 16, 8, 0.0, True)),
        (C.NOT_FOUND, rpc.commit, ("unknown", 0, OWNER, [(0, 1)])),
        (C.INVALID_ARGUMENT, rpc.commit, ("bad", 0, OWNER, [(4, 9)])),
        (C.INVALID_ARGUMENT, rpc.commit, ("bad", 0, OWNER, [(5, 5)])),
        (C.PERMISSION_DENIED, rpc.commit, ("bad", 0, "intruder", [(4, 6)])),
        (C.NOT_FOUND, rpc.read_rows, ("unknown", 0, 0, 1)),
        (C.INVALID_ARGUMENT, rpc.read_rows, ("bad", 0, 0, 9)),
        (C.FAILED_PRECONDITION, rpc.read_rows, ("bad", 0, 0, 8, True)),
        (C.INVALID_ARGUMENT, rpc.write_rows, ("bad", 0, OWNER, 4, b"\x01" * 15, 15)),  # size
        (C.INVALID_ARGUMENT, rpc.write_rows, ("bad", 0, OWNER, 7, b"\x01" * 32, 16)),
        (C.FAILED_PRECONDITION, rpc.write_rows, ("bad", 0, OWNER, 3, b"\x01" * 32, 16)),
        (C.INVALID_ARGUMENT, rpc.write_rows, ("bad", 0, OWNER, 4, b"", 16)),
        (C.PERMISSION_DENIED, rpc.write_rows, ("bad", 0, "intruder", 4, b"\x01" * 16, 16)),
        (C.NOT_FOUND, rpc.write_rows, ("unknown", 0, OWNER, 0, b"\x01" * 16, 16)),
        (C.PERMISSION_DENIED, rpc.close, ("bad", 0, "intruder")),
        (C.NOT_FOUND, rpc.close, ("bad", 1, OWNER)),
        (C.NOT_FOUND, rpc.renew, (OWNER, [("unknown", 0)])),
        (C.INVALID_ARGUMENT, rpc.renew, (OWNER, None, -5.0)),
        (C.INVALID_ARGUMENT, rpc.renew, ("", None)),
    ]
    for code, fn, args in cases:
        assert grpc_code(fn, *args) == code, (fn.__name__, args)
        assert state(rpc) == before, (fn.__name__, args)


def test_oversized_and_mixed_chunks_are_refused(rpc: KVStoreRPC) -> None:
    rpc.open("chunky", 0, OWNER, 16, 1 << 16)
    before = state(rpc)
    key = pb.HistoryKey(request_id="chunky", source_id=0)
    too_big = [pb.WriteRowsChunk(key=key, owner=OWNER, first_row=0, data=b"\0" * (CHUNK + 16))]
    with pytest.raises(grpc.RpcError) as e:
        rpc.stub.WriteRows(iter(too_big))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    huge = [pb.WriteRowsChunk(key=key, owner=OWNER, first_row=0, data=b"\0" * (9 << 20))]
    with pytest.raises(grpc.RpcError) as e:  # over the server's message limit
        rpc.stub.WriteRows(iter(huge))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    other = pb.HistoryKey(request_id="other", source_id=0)
    mixed = [pb.WriteRowsChunk(key=key, owner=OWNER, first_row=0, data=b"\1" * 16),
             pb.WriteRowsChunk(key=other, owner=OWNER, first_row=1, data=b"\1" * 16)]
    with pytest.raises(grpc.RpcError) as e:
        rpc.stub.WriteRows(iter(mixed))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert state(rpc)[:3] == before[:3]  # no commit, no new history
    with pytest.raises(grpc.RpcError) as e:
        rpc.stub.WriteRows(iter([]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_metrics_endpoint(server: StoreProcess, rpc: KVStoreRPC) -> None:
    rpc.open("m", 0, OWNER, 4096, 2)
    grpc_code(rpc.open, "m", 0, OWNER, 4096, 2)
    port = server.args[server.args.index("--metrics-port") + 1]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'dhisparse_kvstore_bytes{state="used"} 8192.0' in text
    assert 'dhisparse_kvstore_bytes{state="capacity"} 6.7108864e+07' in text
    assert "dhisparse_kvstore_histories 1.0" in text
    assert 'dhisparse_kvstore_rpc_errors_total{code="ALREADY_EXISTS",method="OpenHistory"}' in text
    assert 'dhisparse_kvstore_rpcs_total{code="OK",method="OpenHistory"}' in text
    assert "dhisparse_kvstore_lease_expiries_total" in text


def test_bearer_token_and_restart_reattaches(prefix: str, tmp_path: Path) -> None:
    proc = StoreProcess(prefix, tmp_path, "--token", "s3cret").start()
    try:
        anon = KVStoreRPC(proc.target)
        assert grpc_code(anon.stats) == grpc.StatusCode.UNAUTHENTICATED
        rpc = KVStoreRPC(proc.target, token="s3cret")
        rpc.open("keep", 0, OWNER, 16, 4)
        rpc.write_rows("keep", 0, OWNER, 0, b"\x42" * 64, 16, commit=True)
        assert proc.stop() == 0  # SIGTERM: graceful, segments and manifest stay
        proc.start()
        rpc.wait_ready()
        assert rpc.read_rows("keep", 0, 0, 4, require_backed=True) == b"\x42" * 64
        rpc.close("keep", 0, OWNER)
        assert_no_segments(prefix)
    finally:
        proc.stop()
