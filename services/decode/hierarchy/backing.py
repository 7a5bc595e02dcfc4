"""In-process host backing: the ``HostBacking`` protocol over a plain torch tensor.

Used by tests and single-process runs; the kvstore's shared-memory backing implements
the same protocol (``services.common.backing``).
"""

from __future__ import annotations

import torch

from services.common.errors import AlreadyExists, InvalidArgument, NotFound


class InProcessBacking:
    """Host rows ``uint8 [num_rows, row_bytes]`` (pinned when ``pin`` and CUDA exist)."""

    def __init__(self, row_bytes: int, num_rows: int, pin: bool = False) -> None:
        if row_bytes <= 0 or num_rows <= 0:
            raise InvalidArgument(
                f"row_bytes={row_bytes}, num_rows={num_rows} must both be > 0"
            )
        pin = pin and torch.cuda.is_available()
        self._rows = torch.empty(num_rows, row_bytes, dtype=torch.uint8, pin_memory=pin)
        # rows [0, _clean) hold written or zeroed bytes; the rest is zeroed when a gap is
        # written past it or the rows are first handed out, so an imported history (written
        # from row 0 right after open) is not zero-filled first (a 21.5 MB memset per
        # history), while every byte anyone can read stays deterministic
        self._clean = 0
        self._backed = torch.zeros(num_rows, dtype=torch.bool)
        self._closed = False
        self.created = True  # the provider sets False when an open re-attaches it

    @property
    def row_bytes(self) -> int:
        return self._rows.shape[1]

    @property
    def num_rows(self) -> int:
        return self._rows.shape[0]

    def rows(self) -> torch.Tensor:
        if self._clean < self.num_rows:
            self._rows[self._clean:].zero_()
            self._clean = self.num_rows
        return self._rows

    def backed_mask(self) -> torch.Tensor:
        return self._backed

    def _check_range(self, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= self.num_rows:
            raise InvalidArgument(
                f"rows [{start}, {stop}) outside the history of num_rows={self.num_rows}"
            )

    def write(self, start: int, data: torch.Tensor) -> None:
        if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] != self.row_bytes:
            raise InvalidArgument(
                f"data has dtype={data.dtype} shape={tuple(data.shape)}; "
                f"expected uint8 [n, {self.row_bytes}]"
            )
        stop = start + data.shape[0]
        self._check_range(start, stop)
        if start > self._clean:
            self._rows[self._clean : start].zero_()
        self._rows[start:stop].copy_(data)
        self._clean = max(self._clean, stop)

    def commit(self, start: int, stop: int) -> None:
        self._check_range(start, stop)
        self._backed[start:stop] = True

    def close(self) -> None:
        self._closed = True


class InProcessBackingProvider:
    """Opens ``InProcessBacking`` histories keyed by ``(request_id, source_id)``."""

    def __init__(self, pin: bool = False) -> None:
        self.pin = pin
        self.histories: dict[tuple[str, int], InProcessBacking] = {}

    def open(self, request_id: str, source_id: int, row_bytes: int, num_rows: int):
        key = (request_id, source_id)
        found = self.histories.get(key)
        if found is not None:  # re-attach
            if (found.row_bytes, found.num_rows) != (row_bytes, num_rows):
                raise AlreadyExists(
                    f"history {key} exists with row_bytes={found.row_bytes}, "
                    f"num_rows={found.num_rows}; asked row_bytes={row_bytes}, "
                    f"num_rows={num_rows}"
                )
            found.created = False
            return found
        backing = InProcessBacking(row_bytes, num_rows, pin=self.pin)
        self.histories[key] = backing
        return backing

    def close(self, request_id: str, source_id: int) -> None:
        backing = self.histories.pop((request_id, source_id), None)
        if backing is None:
            raise NotFound(f"history request_id={request_id!r} source_id={source_id} not found")
        backing.close()
