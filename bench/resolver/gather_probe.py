"""Launchers of ``gather_probe.cu``: ways to read isolated host rows, for
``bench/bench_host_gather.py --variants``. Each variant gathers ``dst[i] = src[idx[i]]``.

Variants (name: kernel, threads per block, extra):
- ``ldg``, ``ldg_l2_128``, ``ldg_l2_256``: 16-byte loads with no / a 128-byte / a 256-byte
  L2 prefetch-size hint (256 threads);
- ``ldg_span``: 16-byte loads of the row's covering 128-byte lines (256 threads);
- ``bulk_d<D>``, ``bulk_span_d<D>``: cp.async.bulk per row (lane 0 of 4 warps per block,
  D rows in flight per warp), of the row or of its covering lines.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
BULK_WARPS = 4


@functools.cache
def _module(device: int):
    import cupy

    with cupy.cuda.Device(device):
        return cupy.RawModule(code=(HERE / "gather_probe.cu").read_text(), options=("-std=c++17",))


def variant(name: str, device: int):
    """``run(grid, dst, src, idx, row_bytes)``: ``name``'s gather on ``grid`` blocks."""
    from kernels._loader import launch, ptr

    mod = _module(device)
    if name.startswith("bulk"):
        span = name.startswith("bulk_span")
        depth = int(name.rsplit("_d", 1)[1])
        fn = mod.get_function(f"probe_bulk_{int(span)}")

        def run(grid, dst, src, idx, row_bytes):
            buf = ((row_bytes + 127) // 128 + 1) * 128 if span else row_bytes
            shared = BULK_WARPS * depth * buf
            if shared > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = shared
            launch(
                fn,
                (grid,),
                (32 * BULK_WARPS,),
                (
                    ptr(dst),
                    ptr(src),
                    ptr(idx),
                    np.uint32(idx.numel()),
                    np.uint32(row_bytes),
                    np.int32(depth),
                ),
                shared=shared,
            )

        return run
    kernels = {
        "ldg": "probe_ldg_0",
        "ldg_l2_128": "probe_ldg_1",
        "ldg_l2_256": "probe_ldg_2",
        "ldg_span": "probe_ldg_span",
    }
    if name not in kernels:
        raise ValueError(f"variant={name!r}; expected one of {sorted(kernels)} or bulk[_span]_d<D>")
    fn = mod.get_function(kernels[name])

    def run(grid, dst, src, idx, row_bytes):
        launch(
            fn,
            (grid,),
            (256,),
            (ptr(dst), ptr(src), ptr(idx), np.uint32(idx.numel()), np.uint32(row_bytes)),
        )

    return run


def check(dst: torch.Tensor, host: torch.Tensor, idx: torch.Tensor) -> bool:
    """Whether every gathered row equals its host row."""
    return bool(torch.equal(dst.cpu(), host[idx.cpu()]))
