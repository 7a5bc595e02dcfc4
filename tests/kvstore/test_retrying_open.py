"""RetryingProvider across store faults: every attempt of an open carries one token, so a
retry after a lost reply learns that the history is its own creation (a failed admission then
frees it); closes never fail for the store, they wait in a background closer."""

from __future__ import annotations

from types import SimpleNamespace

from services.common.errors import DeadlineExceeded, NotFound, Unavailable
from services.decode.host_backing import RetryingProvider
from services.kvstore.store import KVStore
from tests.cluster.harness import wait_for
from tests.kvstore.harness import Clock, assert_no_segments, options


class LosingClient:
    """KVStoreClient stand-in over a store core whose first open reply never arrives."""

    def __init__(self, store: KVStore) -> None:
        self.store, self.tokens, self.replies_lost = store, [], 0

    def open(self, request_id: str, source_id: int, row_bytes: int, num_rows: int,
             open_id: str = "") -> SimpleNamespace:
        self.tokens.append(open_id)
        _, created = self.store.open(request_id, source_id, "w0", row_bytes, num_rows,
                                     attach=True, open_id=open_id)
        if not self.replies_lost:
            self.replies_lost += 1
            raise Unavailable("kvstore went away before replying")
        return SimpleNamespace(created=created)

    def detach(self, request_id: str, source_id: int) -> int:
        return 0  # the close frees whatever the key holds

    def close(self, request_id: str, source_id: int, timeout: float | None = None,
              opening: int | None = None) -> None:
        self.store.close_history(request_id, source_id, "w0", opening or 0)

    def shutdown(self) -> None:
        pass


def test_retry_after_a_lost_reply_reports_the_creation(prefix: str) -> None:
    store = KVStore(options(prefix), Clock())
    client = LosingClient(store)
    provider = RetryingProvider(client, retry_seconds=5, backoff_s=0.01)  # type: ignore[arg-type]
    try:
        history = provider.open("r", 0, 16, 8)
        assert history.created  # created by this open, though its first reply was lost
        assert len(client.tokens) == 2 and client.tokens[0] == client.tokens[1] != ""
        # a later, separate open of the same history is a re-attach
        assert not provider.open("r", 0, 16, 8).created
        provider.close("r", 0)
    finally:
        provider.shutdown()
        store.shutdown()
    assert_no_segments(prefix)


class FlakyCloser:
    """A client whose close fails as ``mode`` says."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.openings: dict[tuple[str, int], set[int | None]] = {}  # named by each close
        self.timeouts: set[float | None] = set()
        self.opened: list[tuple[str, int]] = []  # (request, closes tried by then)
        self.mode = "ok"

    def open(self, request_id: str, source_id: int, row_bytes: int, num_rows: int,
             open_id: str = "") -> SimpleNamespace:
        self.opened.append((request_id, len(self.calls)))
        return SimpleNamespace(created=True)

    def detach(self, request_id: str, source_id: int) -> int:
        return 100 + len(request_id)  # the opening of the client's mapping

    def close(self, request_id: str, source_id: int, timeout: float | None = None,
              opening: int | None = None) -> None:
        self.calls.append((request_id, source_id))
        self.openings.setdefault((request_id, source_id), set()).add(opening)
        self.timeouts.add(timeout)
        if self.mode == "down":
            raise Unavailable("kvstore down")
        if self.mode == "slow":
            raise DeadlineExceeded("kvstore did not answer in time")
        if self.mode == "gone":
            raise NotFound("lease ran out")

    def shutdown(self) -> None:
        pass


def test_closes_are_deferred_on_any_store_error_and_survive_them() -> None:
    """A release never fails for the store: NotFound means freed already, any other error
    defers the close; the background closer outlives errors other than Unavailable and
    keeps every deferred close until it went through."""
    client = FlakyCloser()
    provider = RetryingProvider(client)  # type: ignore[arg-type]
    try:
        client.mode = "gone"
        provider.close("x", 0)  # no error, nothing kept
        wait_for(lambda: provider.deferred == 0 and client.calls == [("x", 0)], 5,
                 "the close of x through")
        client.mode = "down"
        provider.close("a", 0)
        client.mode = "slow"
        provider.close("b", 0)
        assert provider.deferred == 2
        wait_for(lambda: client.calls.count(("a", 0)) >= 2, 5, "the closer's second try of a")
        assert provider._closer.is_alive() and provider.deferred == 2
        client.mode = "ok"
        wait_for(lambda: provider.deferred == 0, 5, "every deferred close through")
        assert ("b", 0) in client.calls[-2:] and provider._closer.is_alive()
        # a stalled store holds an open of the key being closed for the short close
        # timeout, not the client's RPC timeout
        assert client.timeouts == {provider.close_timeout_s} and provider.close_timeout_s <= 1
        # every try names the opening the release detached: a key opened again meanwhile
        # (a newer opening in the store) is not freed by a late retry
        assert client.openings[("a", 0)] == {101} and client.openings[("b", 0)] == {101}
    finally:
        provider.shutdown()


def test_an_open_waits_for_the_queued_close_of_its_key() -> None:
    """Released while the store was down (its close queued), then admitted again: the open
    waits until that close went through and then creates the history anew, as after a
    synchronous release (a re-attach of the released history would keep its old rows, and
    a failed admission would not free it)."""
    import threading

    client = FlakyCloser()
    provider = RetryingProvider(client)  # type: ignore[arg-type]
    try:
        client.mode = "down"
        provider.close("r", 0)
        wait_for(lambda: client.calls == [("r", 0)], 5, "the first try of the close")
        reopen = threading.Thread(target=provider.open, args=("r", 0, 16, 8))
        reopen.start()
        reopen.join(0.8)  # a retry of the close (every 0.5 s) fails meanwhile
        assert reopen.is_alive() and not client.opened and provider.deferred == 1
        client.mode = "ok"
        reopen.join(5)
        assert [r for r, _ in client.opened] == ["r"] and provider.deferred == 0
        assert client.calls[-1] == ("r", 0) and client.opened[0][1] == len(client.calls) >= 2
    finally:
        provider.shutdown()


def test_a_release_never_waits_for_the_store_and_an_open_waits_only_for_its_own_key(
) -> None:
    """The engine thread releases and goes on while the closer's attempt waits for a stalled
    store; an open of another key is not held, an open of a key whose close is queued
    waits until that close went through."""
    import threading

    class GatedCloser(FlakyCloser):
        def __init__(self) -> None:
            super().__init__()
            self.gate, self.entered = threading.Event(), threading.Event()

        def close(self, request_id, source_id, timeout=None, opening=None):
            self.entered.set()
            assert self.gate.wait(10)
            super().close(request_id, source_id, timeout, opening)

    client = GatedCloser()
    provider = RetryingProvider(client)  # type: ignore[arg-type]
    try:
        client.mode = "slow"
        provider.close("a", 0)
        provider.close("b", 0)
        assert client.entered.wait(5) and not client.gate.is_set()  # returned, a stuck
        assert provider.deferred == 2
        provider.open("c", 0, 16, 8)  # another key: not held by a's attempt
        assert client.opened == [("c", 0)]
        reopen = threading.Thread(target=provider.open, args=("a", 0, 16, 8))
        reopen.start()
        client.gate.set()  # a's attempt fails (slow): a stays queued, the open waits
        wait_for(lambda: client.calls == [("a", 0)], 5, "a's first attempt")
        assert reopen.is_alive()
        client.mode = "ok"
        reopen.join(5)
        wait_for(lambda: provider.deferred == 0, 5, "b's close through")
        assert client.calls == [("a", 0), ("a", 0), ("b", 0)]
        # a opened once its close had gone through (b's may have followed before it)
        assert client.opened[0] == ("c", 0) and client.opened[1][0] == "a"
        assert client.opened[1][1] >= 2
    finally:
        provider.shutdown()


def test_an_open_refused_for_capacity_waits_for_the_queued_closes() -> None:
    """A release no longer frees the store's bytes before it returns: the next admission's
    open can find the store full while the close that makes room is queued. It is tried
    again once that close went through; with nothing queued the refusal stands."""
    import threading

    from services.common.errors import ResourceExhausted

    class OneRoom(FlakyCloser):
        def __init__(self) -> None:
            super().__init__()
            self.held: set[str] = set()
            self.gate = threading.Event()

        def open(self, request_id, source_id, row_bytes, num_rows, open_id=""):
            if self.held - {request_id}:
                raise ResourceExhausted("capacity=1 history")
            self.held.add(request_id)
            return SimpleNamespace(created=True)

        def close(self, request_id, source_id, timeout=None, opening=None):
            assert self.gate.wait(10)
            super().close(request_id, source_id, timeout, opening)
            self.held.discard(request_id)

    client = OneRoom()
    provider = RetryingProvider(client)  # type: ignore[arg-type]
    try:
        provider.open("x", 0, 16, 8)
        provider.close("x", 0)  # queued: its attempt waits at the gate
        opener = threading.Thread(target=provider.open, args=("y", 0, 16, 8))
        opener.start()
        opener.join(0.3)
        assert opener.is_alive() and client.held == {"x"}  # refused once, waiting
        client.gate.set()
        opener.join(5)
        assert client.held == {"y"} and provider.deferred == 0
        try:
            provider.open("z", 0, 16, 8)  # nothing queued: the refusal stands
        except ResourceExhausted:
            pass
        else:
            raise AssertionError("z fitted in a full store")
    finally:
        provider.shutdown()


def test_the_renewer_keeps_only_the_histories_this_client_mapped() -> None:
    """Every history of the owner used to be renewed, so one created by an open whose reply
    never came (not mapped here) lived as long as the worker. A key the store forgot does not
    stop the renewal of the others (the store renews a list all or nothing)."""
    from services.kvstore.client import KVStoreClient

    class Rpc:
        def __init__(self) -> None:
            self.calls: list[list] = []

        def renew(self, owner, keys, lease_seconds):
            self.calls.append(list(keys))
            if ("gone", 0) in keys:
                raise NotFound("history gone/0 not found")
            return SimpleNamespace(renewed=len(keys))

        def close_channel(self) -> None:
            pass

    client = KVStoreClient("127.0.0.1:1", "w0", renew=False, register_cuda=False)
    client.rpc = Rpc()  # type: ignore[assignment]
    client._open = {("a", 0): SimpleNamespace(closed=False),  # type: ignore[dict-item]
                    ("b", 1): SimpleNamespace(closed=True),
                    ("gone", 0): SimpleNamespace(closed=False)}
    assert client.renew() == 1  # "a" alone: "b" is unmapped, "gone" unknown to the store
    assert client.rpc.calls == [[("a", 0), ("gone", 0)], [("a", 0)], [("gone", 0)]]
    client._open = {}
    assert client.renew() == 0 and len(client.rpc.calls) == 3  # nothing mapped: no call


class StalledClient(LosingClient):
    """Its first open and first commit time out (the store stalled) after taking effect."""

    def __init__(self, store: KVStore) -> None:
        super().__init__(store)
        self.commits = 0

    def open(self, request_id: str, source_id: int, row_bytes: int, num_rows: int,
             open_id: str = "") -> SimpleNamespace:
        self.tokens.append(open_id)
        _, created = self.store.open(request_id, source_id, "w0", row_bytes, num_rows,
                                     attach=True, open_id=open_id)
        if len(self.tokens) == 1:
            raise DeadlineExceeded("kvstore did not answer in time")
        client = self

        class Inner:
            def commit(self, start: int, stop: int) -> None:
                client.store.commit(request_id, source_id, "w0", [(start, stop)])
                client.commits += 1
                if client.commits == 1:
                    raise DeadlineExceeded("kvstore did not answer in time")

        inner = Inner()
        inner.created = created
        return inner


def test_a_stalled_store_is_waited_for_not_fatal(prefix: str) -> None:
    """A store that answers late (stopped, or busy) makes open and commit time out; both
    are repeated like an unreachable store's (a commit of backed rows changes nothing)
    instead of failing the engine's round."""
    store = KVStore(options(prefix), Clock())
    client = StalledClient(store)
    provider = RetryingProvider(client, retry_seconds=5, backoff_s=0.01)  # type: ignore[arg-type]
    try:
        history = provider.open("r", 0, 16, 8)
        assert history.created and len(client.tokens) == 2
        history.commit(0, 4)
        assert client.commits == 2 and provider.retries == 2
        assert store.commit("r", 0, "w0", [(0, 1)]) == ((0, 4),)
        provider.close("r", 0)
    finally:
        provider.shutdown()
        store.shutdown()
    assert_no_segments(prefix)
