"""Lazy CuPy loader: compile ``kernels/<name>.cu`` once per device, launch on torch's stream.

Compiled with NVRTC, ``-std=c++17`` and without ``--use_fast_math`` (the kernels move
bytes and compare integers; nothing may be approximated). CuPy is imported here only,
inside functions, so ``import kernels`` works on a machine without it.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from services.common.errors import InvalidArgument

HERE = Path(__file__).resolve().parent
OPTIONS = ("-std=c++17",)
# modules kept in several files, compiled as one source in this order
SOURCES = {"resolver": ("resolver_common.cuh", "resolver_sort.cuh", "resolver_lookup.cu",
                         "resolver_commit.cu", "resolver_promote.cu")}
_LOCAL_INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')


def source(name: str) -> str:
    """The NVRTC source of module ``name``: ``kernels/<name>.cu``, or its parts (``SOURCES``)
    joined in order with each part's ``#include`` of a sibling part dropped (the parts
    include their header so that ``nvcc -cubin kernels/<part>.cu`` checks each alone)."""
    parts = SOURCES.get(name, (f"{name}.cu",))
    lines: list[str] = []
    for part in parts:
        for line in (HERE / part).read_text().splitlines():
            m = _LOCAL_INCLUDE.match(line)
            if m is None or m.group(1) not in parts:
                lines.append(line)
    return "\n".join(lines) + "\n"


@functools.cache
def module(name: str, device: int, defines: tuple[str, ...] = ()) -> Any:
    """``kernels/<name>.cu`` compiled for ``device``; ``defines`` ("-DNAME") select
    compile-time variants (e.g. the resolver's phase trace), each cached apart."""
    import cupy

    with cupy.cuda.Device(device):
        return cupy.RawModule(code=source(name), options=OPTIONS + tuple(defines))


@functools.cache
def kernel(name: str, func: str, device: int, big_shared: bool = False,
           defines: tuple[str, ...] = ()) -> Any:
    """The compiled ``func`` of ``kernels/<name>.cu`` on ``device``; with ``big_shared`` its
    dynamic shared memory may grow to ``dynamic_shared_cap`` (above the default 48 KB)."""
    fn = module(name, device, defines).get_function(func)
    if big_shared:
        fn.max_dynamic_shared_size_bytes = dynamic_shared_cap(fn, device)
    return fn


def dynamic_shared_cap(fn: Any, device: int) -> int:
    """Opt-in shared memory per block minus the kernel's static shared memory."""
    optin = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    return optin - int(fn.shared_size_bytes)


@functools.cache
def sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch(
    fn: Any, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared: int = 0
) -> None:
    """Launch on ``torch.cuda.current_stream()`` (ordered with the caller's torch work)."""
    import cupy

    dev = torch.cuda.current_device()
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream, dev)
    with cupy.cuda.Device(dev), stream:
        fn(grid, block, args, shared_mem=shared)


def ptr(t: torch.Tensor) -> np.uint64:
    return np.uint64(t.data_ptr())


def vec_width(row_bytes: int, *tensors: torch.Tensor) -> int:
    """Widest access (16, 8 or 4 bytes) dividing the row size and every base address."""
    for w in (16, 8, 4):
        if row_bytes % w == 0 and all(t.data_ptr() % w == 0 for t in tensors):
            return w
    raise InvalidArgument(f"row_bytes={row_bytes} must be a multiple of 4 (4-byte aligned rows)")


def check(name: str, t: object, dtype: torch.dtype, dims: int, where: str) -> torch.Tensor:
    """``t`` is a contiguous ``dtype`` tensor with ``dims`` dims on ``where``.

    ``where``: "cuda" (device memory), "mapped" (device memory or pinned host memory,
    read in place by the GPU) or "any".
    """
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(f"{name} is a {type(t).__name__}; expected a torch.Tensor")
    if t.dtype != dtype or t.dim() != dims:
        raise InvalidArgument(
            f"{name} has dtype={t.dtype} shape={tuple(t.shape)}; expected {dtype} with {dims} dims"
        )
    if not t.is_contiguous():
        raise InvalidArgument(f"{name} has strides={t.stride()}; expected a contiguous tensor")
    if where == "cuda" and t.device.type != "cuda":
        raise InvalidArgument(f"{name} is on device={t.device}; expected a CUDA tensor")
    if where == "mapped" and t.device.type != "cuda" and not t.is_pinned():
        raise InvalidArgument(
            f"{name} is on device={t.device} and not page-locked; expected a CUDA tensor or "
            f"pinned host memory (pin_memory() / cudaHostRegister) the GPU can read in place"
        )
    return t


def check_limit(name: str, value: int, limit: int) -> None:
    if value > limit:
        raise InvalidArgument(f"{name}={value} exceeds the kernel limit {limit}")
