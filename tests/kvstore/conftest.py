"""Fixtures: unique store prefixes whose /dev/shm files are removed after the test (the
tests that must leave none check that themselves, ``assert_no_segments``), an in-process
store on a hand-moved clock, a store process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.kvstore.store import KVStore
from tests.kvstore.harness import Clock, StoreProcess, options, remove_store_files, unique_prefix


@pytest.fixture
def prefix() -> Iterator[str]:
    p = unique_prefix()
    yield p
    remove_store_files(p)


@pytest.fixture
def store_proc(prefix: str, tmp_path: Path) -> Iterator[StoreProcess]:
    """A running kvstore; after the test it must stop cleanly on SIGTERM."""
    proc = StoreProcess(prefix, tmp_path).start()
    yield proc
    assert proc.stop() == 0, proc.log.read_text()[-3000:]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(prefix: str, clock: Clock) -> Iterator[KVStore]:
    s = KVStore(options(prefix), clock)
    yield s
    s.shutdown()
