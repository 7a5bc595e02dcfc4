"""Fixtures: unique store prefixes whose /dev/shm files are removed (and checked)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kvstore.harness import StoreProcess, remove_store_files, unique_prefix


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
