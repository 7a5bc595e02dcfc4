"""One resolver round on the sync-free path: ``lookup`` and ``commit`` (with the miss copies
of the layers in ``host_ptrs``) in a single cooperative launch where it fits
(kernels/resolver_fused.cu), else as the two launches of ``kernels.resolver``.

The single launch runs one block per SM: request blocks first (the lookup, then the
commit of their request), the remaining SMs' blocks copy the misses. Its blocks meet at
a grid barrier where the two launches meet at a kernel boundary, so the results are the
same; what it saves is a launch and the wait between the two grids (a no-miss call is
mostly such fixed costs).
"""

from __future__ import annotations

import numpy as np
import torch

from services.common.errors import InvalidArgument

from ._loader import (
    cooperative_launch_available,
    dynamic_shared_cap,
    kernel,
    launch_cooperative,
    sm_count,
)
from .resolver import (
    LOOKUP_THREADS,
    MAX_COPY_BLOCKS,
    CopyList,
    Workspace,
    commit,
    commit_args,
    default_copy_blocks,
    defines,
    lookup,
    lookup_args,
)
from .resolver_settings import one_launch_enabled

ONE_LAUNCH_COPY_BLOCKS_MIN = 16  # SMs left to the copy blocks, or two launches instead


def one_launch_grid(batch: int, layers: int, sms: int) -> int:
    """Blocks of the single launch (one per SM at most), or 0 where the batch leaves fewer
    than ONE_LAUNCH_COPY_BLOCKS_MIN SMs to the copy blocks: then two launches run it."""
    if batch + ONE_LAUNCH_COPY_BLOCKS_MIN > sms:
        return 0
    return sms if layers else batch


def resolve_round(
    ws: Workspace,
    table: torch.Tensor,
    selections: torch.Tensor,
    visible: torch.Tensor,
    locations: torch.Tensor,
    stage_locs: torch.Tensor,
    out: CopyList,
    *,
    hot_slots: int,
    tail_rows: int,
    page_rows: int,
    rows_bound: int,
    finished_epoch: int,
    epoch: int,
    host_ptrs: torch.Tensor | None = None,
    payloads: torch.Tensor | None = None,
    row_bytes: int = 16,
    copy_blocks: int | None = None,
    select: str | None = None,
    one_launch: bool | None = None,
) -> bool:
    """``lookup(host_totals=False)`` then ``commit(dependent=True)`` with these arguments
    (see both), as one launch when ``one_launch`` (None = ``DHISPARSE_ONE_LAUNCH``), the
    driver has cooperative launches, the batch leaves ONE_LAUNCH_COPY_BLOCKS_MIN SMs free
    and the lookup's shared memory fits the fused kernel; returns whether it did.

    copy_blocks: copy blocks at work (None = ``default_copy_blocks()``, 0 = the kernel's
    rule); the single launch has one per SM not taken by a request, 1024 threads each."""
    if one_launch is None:
        one_launch = one_launch_enabled()
    if copy_blocks is None:
        copy_blocks = default_copy_blocks()
    if not 0 <= copy_blocks <= MAX_COPY_BLOCKS:
        raise InvalidArgument(f"copy_blocks={copy_blocks} must be in [0, {MAX_COPY_BLOCKS}]")
    look, shared, _ = lookup_args(
        ws, table, selections, visible, locations, hot_slots=hot_slots, tail_rows=tail_rows,
        page_rows=page_rows, rows_bound=rows_bound, finished_epoch=finished_epoch,
        select=select)
    copies, layers, w = commit_args(ws, table, selections, locations, stage_locs, out,
                                    hot_slots=hot_slots, host_ptrs=host_ptrs,
                                    payloads=payloads, row_bytes=row_bytes)
    dev = selections.device.index
    grid = one_launch_grid(selections.shape[0], layers, sm_count(dev)) if one_launch else 0
    fn = None
    if grid and cooperative_launch_available():
        fn = kernel("resolver", f"resolve_fused_{w}", dev, True, defines())
        if shared > dynamic_shared_cap(fn, dev):
            fn = None  # the commit's static offsets leave less room: lookup() checks it
    if fn is None:
        lookup(ws, table, selections, visible, locations, hot_slots=hot_slots,
               tail_rows=tail_rows, page_rows=page_rows, rows_bound=rows_bound,
               finished_epoch=finished_epoch, select=select, host_totals=False)
        commit(ws, table, selections, locations, stage_locs, out, epoch=epoch,
               hot_slots=hot_slots, host_ptrs=host_ptrs, payloads=payloads,
               row_bytes=row_bytes, copy_blocks=copy_blocks, dependent=True)
        return False
    args = (*look, *copies, np.int32(layers), np.uint32(row_bytes), np.int64(epoch),
            np.int32(copy_blocks))
    launch_cooperative(fn, (grid,), (LOOKUP_THREADS,), args, shared)
    ws.commit_sums = False  # the launch summed the batch; totals are final
    return True
