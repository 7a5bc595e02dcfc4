"""RetryingProvider.open across a lost reply: every attempt carries one open token, so the
retry learns that the history is its own creation (a failed admission then frees it)."""

from __future__ import annotations

from types import SimpleNamespace

from services.common.errors import Unavailable
from services.decode.host_backing import RetryingProvider
from services.kvstore.store import KVStore
from tests.kvstore.harness import assert_no_segments
from tests.kvstore.test_core import Clock, options


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

    def close(self, request_id: str, source_id: int) -> None:
        self.store.close_history(request_id, source_id, "w0")

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
