"""The host-backing interface between the decode hierarchy and the host KV store.

A *history* is the host copy of one request's rows for one KV source: ``num_rows``
fixed-size rows of ``row_bytes`` bytes. The decode hierarchy (``services.decode.hierarchy``)
only talks to this protocol; two implementations exist:

* ``services.decode.hierarchy.backing.InProcessBacking`` — a plain (optionally pinned)
  torch tensor, for tests and single-process runs;
* ``services.kvstore.client`` — a shared-memory segment owned by the node's kvstore,
  mapped into the worker (and registered with CUDA on a GPU machine, so kernels read
  host rows directly: zero-copy).

Writing rows and marking them *backed* are separate steps (I4: a row counts as having a
host copy only after the copy completed and was committed)::

    h.write(start, rows)       # bytes land in host memory, not yet backed
    h.commit(start, stop)      # now rows[start:stop] count as backed (H_r grows)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class HostBacking(Protocol):
    """Host rows of one (request, source) history."""

    @property
    def row_bytes(self) -> int:
        """Bytes per row."""
        ...

    @property
    def num_rows(self) -> int:
        """Capacity in rows (rows ``0 .. num_rows-1`` are addressable)."""
        ...

    def rows(self) -> torch.Tensor:
        """The host rows as a ``uint8 [num_rows, row_bytes]`` CPU tensor, without copying.

        On a CUDA machine the memory is page-locked and mapped, so a kernel can read it
        through the device pointer of the mapping.
        """
        ...

    def backed_mask(self) -> torch.Tensor:
        """``bool [num_rows]``: True where the row has a complete, committed host copy."""
        ...

    def write(self, start: int, data: torch.Tensor) -> None:
        """Copy ``uint8 [n, row_bytes]`` rows (on any device: device rows are copied by DMA
        straight into the mapping) into host rows ``start .. start+n-1``.

        Does not mark them backed. Raises ``InvalidArgument`` for a bad range or shape.
        """
        ...

    def commit(self, start: int, stop: int) -> None:
        """Mark rows ``start .. stop-1`` as backed (their bytes were written before)."""
        ...

    def close(self) -> None:
        """Release the mapping (and the CUDA registration). Idempotent."""
        ...

    @property
    def created(self) -> bool:
        """True when the ``open`` that returned this history created it, False when it
        re-attached an existing one (a failed admission frees only what it created)."""
        ...


class HostBackingProvider(Protocol):
    """Opens host histories; one per decode worker."""

    def open(self, request_id: str, source_id: int, row_bytes: int, num_rows: int) -> HostBacking:
        """Create (or re-attach) the history of ``(request_id, source_id)``."""
        ...

    def close(self, request_id: str, source_id: int) -> None:
        """Free the history: at once, unknown keys raising ``NotFound``, or (a provider
        over a store that may not answer, ``services.decode.host_backing``) in the
        background, never raising for the store; an ``open`` of the key afterwards sees it
        freed either way."""
        ...
