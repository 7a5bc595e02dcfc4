"""``KVStore.shutdown`` against an open still allocating its segment (outside the store
lock): the open is waited for and its history kept for the next start, or, past the wait,
refused with nothing left behind; opens asked for after shutdown began are refused."""

from __future__ import annotations

import threading

import pytest

from services.common.errors import Unavailable
from services.kvstore.store import KVStore
from tests.cluster.harness import wait_for
from tests.kvstore.harness import (
    Clock,
    assert_no_segments,
    gated_allocation,
    options,
    segments,
)


def _open_in_thread(store: KVStore, results: dict) -> threading.Thread:
    def run() -> None:
        try:
            results["open"] = store.open("big", 0, "w0", 64, 1024)
        except Unavailable as exc:
            results["open"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t


def test_shutdown_waits_for_an_open_allocating_its_segment(store: KVStore, prefix: str,
                                                           clock: Clock, monkeypatch) -> None:
    gate, entered = gated_allocation(monkeypatch)
    results: dict = {}
    opener = _open_in_thread(store, results)
    assert entered.wait(10)
    closer = threading.Thread(target=store.shutdown)
    closer.start()
    wait_for(lambda: store._closing, 5, "shutdown to begin")
    closer.join(0.2)
    assert closer.is_alive()  # waits for the open
    with pytest.raises(Unavailable, match="shutting down: open of history small/0 refused"):
        store.open("small", 0, "w0", 64, 16)
    gate.set()
    opener.join(10)
    closer.join(10)
    assert not closer.is_alive()
    info, created = results["open"]
    assert created and len(segments(prefix)) == 1
    again = KVStore(options(prefix), clock)  # the next start recovers it
    assert again.stats().histories == 1
    assert again.info("big", 0).segment_path == info.segment_path
    again.close_history("big", 0, "w0")
    again.shutdown()
    assert_no_segments(prefix)


def test_an_open_outlasting_the_shutdown_wait_is_refused_and_removed(
        store: KVStore, prefix: str, clock: Clock, monkeypatch) -> None:
    gate, entered = gated_allocation(monkeypatch)
    results: dict = {}
    opener = _open_in_thread(store, results)
    assert entered.wait(10)
    store.shutdown(timeout=0.2)
    gate.set()
    opener.join(10)
    assert isinstance(results["open"], Unavailable)
    assert "shut down while history big/0 was being allocated" in str(results["open"])
    assert_no_segments(prefix)
    again = KVStore(options(prefix), clock)
    assert again.stats().histories == 0 and again.stats().used_bytes == 0
    again.shutdown()
