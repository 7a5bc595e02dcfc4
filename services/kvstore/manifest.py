"""The store's manifest: one small JSON record per history, atomically rewritten.

::

    <manifest_dir>/<segment name>.json   {"request_id": ..., "backed": [[0, 512]], ...}

Every change is durable before the call that made it returns: write a temporary file,
fsync it, rename it over the record, fsync the directory. One file per history keeps a
``CommitRows`` O(1 history) instead of rewriting every history on every commit. Order
of operations keeps recovery simple: a segment is created before its record and deleted
after it, so a crash can leave an orphan segment (deleted on recovery) but never a
record without its segment.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

VERSION = 1


@dataclass(slots=True)
class HistoryRecord:
    """What survives a store crash about one history."""

    request_id: str
    source_id: int
    owner: str
    row_bytes: int
    num_rows: int
    segment: str
    segment_bytes: int
    lease_expires: float
    backed: list[list[int]] = field(default_factory=list)
    version: int = VERSION
    open_id: str = ""  # token of the open that created it (OpenHistoryRequest.open_id)


class Manifest:
    """A directory of ``HistoryRecord`` files."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _path(self, segment: str) -> Path:
        return self.directory / f"{segment}.json"

    def save(self, record: HistoryRecord) -> None:
        """Durably replace the record of ``record.segment``."""
        final = self._path(record.segment)
        tmp = self.directory / f".{record.segment}.tmp"
        data = json.dumps(asdict(record), separators=(",", ":")).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        self._sync_dir()

    def remove(self, segment: str) -> None:
        self._path(segment).unlink(missing_ok=True)
        self._sync_dir()

    def load(self) -> list[HistoryRecord]:
        """Every readable record; unreadable ones and stale temporaries are removed."""
        records = []
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith("."):
                path.unlink(missing_ok=True)  # a rename that never happened
                continue
            if path.suffix != ".json":
                continue
            try:
                raw = json.loads(path.read_bytes())
                if raw.get("version") != VERSION:
                    raise ValueError(f"version {raw.get('version')!r}")
                records.append(HistoryRecord(**raw))
            except (OSError, ValueError, TypeError) as e:
                log.error("dropping unreadable manifest record %s: %s", path, e)
                path.unlink(missing_ok=True)
        return records

    def _sync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
