"""Validation of what callers name: request ids, owners, sources, row shapes, leases.

Messages name the argument, the value and the limit (they reach the caller verbatim).
"""

from __future__ import annotations

import math
import re

from services.common.errors import InvalidArgument

MAX_ID_LEN = 128
ID_CHARS = "A-Za-z0-9._:-"
_ID_RE = re.compile(rf"^[{ID_CHARS}]+$")
PREFIX_RE = re.compile(r"^[A-Za-z0-9._]+(?:-[A-Za-z0-9._]+)*$")
MAX_SOURCE_ID = 2**31 - 1
MAX_NUM_ROWS = 2**40

HistoryKey = tuple[str, int]
"""``(request_id, source_id)``: one history per request and KV source."""


def check_id(name: str, value: str) -> str:
    """A request id or owner: 1..128 characters from ``[A-Za-z0-9._:-]``."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name} is empty; expected 1..{MAX_ID_LEN} characters "
                              f"from [{ID_CHARS}]")
    if len(value) > MAX_ID_LEN:
        raise InvalidArgument(f"{name} has {len(value)} characters; the limit is {MAX_ID_LEN}")
    if not _ID_RE.match(value):
        bad = sorted({c for c in value if not re.match(rf"[{ID_CHARS}]", c)})
        raise InvalidArgument(f"{name}={value[:40]!r} contains {''.join(bad)[:10]!r}; "
                              f"allowed characters are [{ID_CHARS}]")
    return value


def check_key(request_id: str, source_id: int) -> HistoryKey:
    check_id("request_id", request_id)
    if not isinstance(source_id, int) or not 0 <= source_id <= MAX_SOURCE_ID:
        raise InvalidArgument(f"source_id={source_id!r} must be in 0..{MAX_SOURCE_ID}")
    return (request_id, source_id)


def check_shape(row_bytes: int, num_rows: int, max_row_bytes: int) -> None:
    if not 0 < row_bytes <= max_row_bytes:
        raise InvalidArgument(f"row_bytes={row_bytes} must be in 1..{max_row_bytes} "
                              "(a row must fit in one stream chunk)")
    if not 0 < num_rows <= MAX_NUM_ROWS:
        raise InvalidArgument(f"num_rows={num_rows} must be in 1..{MAX_NUM_ROWS}")


def check_rows(start: int, stop: int, num_rows: int, what: str = "rows") -> None:
    """``[start, stop)`` must be a non-empty range inside ``0 .. num_rows``."""
    if not 0 <= start < stop <= num_rows:
        raise InvalidArgument(f"{what} [{start}, {stop}) must be a non-empty range "
                              f"inside [0, {num_rows})")


def check_lease(lease_seconds: float, default: float, limit: float) -> float:
    """0 means the store default; otherwise ``0 < lease_seconds <= limit``."""
    if lease_seconds == 0:
        return default
    if not math.isfinite(lease_seconds) or not 0 < lease_seconds <= limit:
        raise InvalidArgument(f"lease_seconds={lease_seconds} must be in (0, {limit}] "
                              "(0 = the store default)")
    return lease_seconds
