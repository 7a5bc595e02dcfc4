"""Shared-memory segments: one file per history under ``/dev/shm``, mode 0600.

Names are deterministic, so a restarted store finds the segments of its manifest and
a client can be told a path instead of a file descriptor::

    /dev/shm/<prefix>-<sha256(request_id, source_id)[:32]>

Memory is reserved up front (``posix_fallocate``) so a full tmpfs fails ``open`` with
``ResourceExhausted`` instead of killing a mapped reader with SIGBUS later.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
from pathlib import Path

from services.common.errors import ResourceExhausted

PAGE = mmap.PAGESIZE


def segment_name(prefix: str, request_id: str, source_id: int) -> str:
    """The segment file name of ``(request_id, source_id)`` in the store ``prefix``."""
    digest = hashlib.sha256(f"{request_id}\0{source_id}".encode()).hexdigest()[:32]
    return f"{prefix}-{digest}"


def segment_bytes(row_bytes: int, num_rows: int) -> int:
    """Bytes a history occupies: its rows, rounded up to whole pages (tmpfs allocates pages)."""
    n = row_bytes * num_rows
    return (n + PAGE - 1) // PAGE * PAGE


class Segment:
    """One mapped segment file. The store holds one per live history."""

    __slots__ = ("_map", "path", "size")

    def __init__(self, path: Path, size: int, mapping: mmap.mmap) -> None:
        self.path = path
        self.size = size
        self._map = mapping

    @classmethod
    def create(cls, path: Path, size: int, preallocate: bool = True) -> Segment:
        """Create a fresh segment (fails if the file exists). Nothing is left on failure."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                if preallocate:
                    os.posix_fallocate(fd, 0, size)
                else:
                    os.ftruncate(fd, size)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                    raise ResourceExhausted(
                        f"cannot reserve {size} bytes for segment {path.name} in "
                        f"{path.parent}: {os.strerror(e.errno)}"
                    ) from None
                raise
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        return cls(path, size, mapping)

    @classmethod
    def attach(cls, path: Path, size: int) -> Segment:
        """Map an existing segment (store restart). Raises ``FileNotFoundError``/``ValueError``."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise ValueError(f"segment {path} has {actual} bytes, manifest says {size}")
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(path, size, mapping)

    def view(self) -> memoryview:
        """A writable view of the whole mapping (release it before ``close``)."""
        return memoryview(self._map)

    def write(self, offset: int, data: bytes | memoryview) -> None:
        self._map[offset:offset + len(data)] = data

    def read(self, offset: int, length: int) -> bytes:
        return self._map[offset:offset + length]

    def close(self) -> None:
        """Unmap (the file stays: a restarted store re-attaches it)."""
        try:
            self._map.close()
        except BufferError:  # a view is still exported; the mapping goes with it
            pass

    def destroy(self) -> None:
        """Unmap and delete the file; clients that mapped it keep their pages until unmap."""
        self.close()
        self.path.unlink(missing_ok=True)
