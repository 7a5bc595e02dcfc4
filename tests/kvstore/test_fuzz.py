"""Hypothesis fuzz: ≥1,000 random well-formed and malformed messages against one real
store process. It must never crash, never answer INTERNAL/UNKNOWN to a well-formed
message, and never change histories the fuzzer does not own."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.gen.dhisparse.v1 import kvstore_pb2 as pb
from services.kvstore.rpc import KVStoreRPC
from tests.kvstore.harness import StoreProcess, remove_store_files, unique_prefix

METHODS = ["OpenHistory", "WriteRows", "ReadRows", "CommitRows", "CloseHistory", "RenewLease",
           "GetStats"]
STREAMING_IN = {"WriteRows"}
STREAMING_OUT = {"ReadRows"}
GUARDS = [("guard-0", 0), ("guard-1", 3)]
C = grpc.StatusCode
ALLOWED = {C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND, C.ALREADY_EXISTS, C.PERMISSION_DENIED,
           C.RESOURCE_EXHAUSTED, C.FAILED_PRECONDITION}


@pytest.fixture(scope="module")
def tally() -> Iterator[Counter[tuple[str, grpc.StatusCode]]]:
    """Outcomes of well-formed messages; afterwards, proof the fuzz reached the core."""
    seen: Counter[tuple[str, grpc.StatusCode]] = Counter()
    yield seen
    for method in METHODS:
        assert seen[(method, C.OK)] > 0, f"no {method} ever succeeded: {seen}"
    assert len({code for _, code in seen} - {C.OK}) >= 5, seen


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[StoreProcess, KVStoreRPC]]:
    prefix = unique_prefix("fuzz")
    proc = StoreProcess(prefix, tmp_path_factory.mktemp("fuzz"), "--max-chunk-bytes", "8192",
                        capacity="16MiB").start()
    rpc = KVStoreRPC(proc.target, timeout=5.0)
    for rid, sid in GUARDS:
        rpc.open(rid, sid, "guardian", 32, 64, lease_seconds=3600)
        rpc.write_rows(rid, sid, "guardian", 0, bytes(range(256)) * 4, 32, commit=True)
    yield proc, rpc
    rpc.close_channel()
    assert proc.stop() == 0
    remove_store_files(prefix)


def guard_state(rpc: KVStoreRPC) -> list[tuple[bytes, bytes]]:
    out = []
    for rid, sid in GUARDS:
        h = next(h for h in rpc.stats(request_id=rid, include_histories=True).history
                 if h.key.source_id == sid)
        h.lease_expires_unix = 0  # reads never renew; zeroed to compare the rest exactly
        out.append((h.SerializeToString(deterministic=True), rpc.read_rows(rid, sid, 0, 64)))
    return out


# Plausible values, so most calls reach the core and many succeed ...
ids = st.sampled_from(["fz-0", "fz-1"])
srcs = st.integers(0, 1)
counts = st.integers(1, 64)
positions = st.integers(0, 63)
leases = st.sampled_from([0.0, 5.0, 120.0])
payloads = st.integers(1, 8).map(lambda n: b"\x5a" * 32 * n)
keys = st.builds(pb.HistoryKey, request_id=ids, source_id=srcs)
ranges = st.builds(lambda a, n: pb.RowRange(start=a, stop=a + n), positions, st.integers(1, 8))
VALID = {
    "OpenHistory": st.builds(pb.OpenHistoryRequest, key=keys, owner=st.just("fuzz"),
                             row_bytes=st.just(32), num_rows=counts, lease_seconds=leases,
                             attach=st.booleans()),
    "WriteRows": st.lists(st.builds(pb.WriteRowsChunk, key=keys, owner=st.just("fuzz"),
                                    first_row=positions, data=payloads, commit=st.booleans()),
                          min_size=1, max_size=3),
    "ReadRows": st.builds(pb.ReadRowsRequest, key=keys, range=ranges,
                          max_chunk_bytes=st.sampled_from([0, 32, 100]),
                          require_backed=st.booleans()),
    "CommitRows": st.builds(pb.CommitRowsRequest, key=keys, owner=st.just("fuzz"),
                            ranges=st.lists(ranges, min_size=1, max_size=3)),
    "CloseHistory": st.builds(pb.CloseHistoryRequest, key=keys, owner=st.just("fuzz")),
    "RenewLease": st.builds(pb.RenewLeaseRequest, owner=st.just("fuzz"), lease_seconds=leases,
                            keys=st.lists(keys, max_size=2)),
    "GetStats": st.builds(pb.GetStatsRequest, owner=st.sampled_from(["", "fuzz"]),
                          request_id=st.sampled_from(["", "fz-0"]),
                          include_histories=st.booleans()),
}
# ... and one field at a time replaced by something hostile.
WILD = {
    "request_id": st.one_of(st.sampled_from(["guard-0", "guard-1", "", "x" * 129, "a/b", "é"]),
                            st.text(max_size=140)),
    "source_id": st.sampled_from([2, 3, 2**31, 2**32 - 1]),
    "owner": st.one_of(st.sampled_from(["other", "guardian", "guardian-not", "", " "]),
                       st.text(max_size=8)),
    "row_bytes": st.sampled_from([0, 1, 31, 33, 8192, 8193, 2**32 - 1]),
    "num_rows": st.sampled_from([0, 65, 2**20, 2**40, 2**64 - 1]),
    "first_row": st.sampled_from([63, 64, 65, 2**32 - 1, 2**63, 2**64 - 1]),
    "start": st.sampled_from([0, 64, 65, 2**64 - 1]),
    "stop": st.sampled_from([0, 1, 65, 2**64 - 1]),
    "lease_seconds": st.floats(allow_nan=True, allow_infinity=True),
    "data": st.one_of(st.binary(max_size=100), st.integers(0, 300).map(lambda n: b"\x5a" * n)),
    "max_chunk_bytes": st.sampled_from([1, 31, 2**32 - 1]),
}


def _fields(msg: object) -> list[tuple[object, str]]:
    """Every (message, field name) of ``msg`` that WILD knows how to break."""
    out = []
    for desc, value in msg.ListFields() if hasattr(msg, "ListFields") else ():
        if desc.message_type is not None:
            items = [value] if hasattr(value, "ListFields") else list(value)
            out += [f for item in items for f in _fields(item)]
        elif desc.name in WILD:
            out.append((msg, desc.name))
    for name in ("request_id", "owner", "source_id"):  # unset (default) fields count too
        if name in msg.DESCRIPTOR.fields_by_name and (msg, name) not in out:
            out.append((msg, name))
    return out


@st.composite
def well_formed(draw: st.DrawFn) -> tuple[str, object]:
    method = draw(st.sampled_from(METHODS))
    msg = draw(VALID[method])
    if draw(st.integers(0, 2)) > 0:  # two thirds: break one field
        parts = msg if isinstance(msg, list) else [msg]
        fields = [f for part in parts for f in _fields(part)]
        target, name = draw(st.sampled_from(fields))
        setattr(target, name, draw(WILD[name]))
    return method, msg


malformed = st.tuples(st.sampled_from(METHODS), st.binary(max_size=64))


def call_raw(channel: grpc.Channel, method: str, payload: object) -> grpc.StatusCode:
    """Send serialized bytes (or a list of them for WriteRows) without a stub."""
    path = f"/dhisparse.v1.KVStore/{method}"
    try:
        if method in STREAMING_IN:
            channel.stream_unary(path)(iter(payload), timeout=5)  # type: ignore[arg-type]
        elif method in STREAMING_OUT:
            list(channel.unary_stream(path)(payload, timeout=5))
        else:
            channel.unary_unary(path)(payload, timeout=5)
    except grpc.RpcError as e:
        return e.code()
    return C.OK


@settings(max_examples=1100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(st.one_of(well_formed(), well_formed(), well_formed(), malformed))
def test_fuzz_never_crashes_or_touches_other_histories(
        fuzz_store: tuple[StoreProcess, KVStoreRPC], tally: Counter[tuple[str, grpc.StatusCode]],
        case: tuple[str, object]) -> None:
    proc, rpc = fuzz_store
    method, msg = case
    before = guard_state(rpc)
    if isinstance(msg, bytes):  # malformed: arbitrary bytes as the serialized request
        payload: object = [msg] if method in STREAMING_IN else msg
        call_raw(rpc._channel, method, payload)  # any status is fine; surviving is not optional
    else:
        payload = ([m.SerializeToString() for m in msg] if isinstance(msg, list)
                   else msg.SerializeToString())  # type: ignore[attr-defined]
        code = call_raw(rpc._channel, method, payload)
        assert code in ALLOWED, (method, msg, code)
        tally[(method, code)] += 1
    assert proc.alive(), proc.log.read_text()[-3000:]
    assert guard_state(rpc) == before, (method, msg)
