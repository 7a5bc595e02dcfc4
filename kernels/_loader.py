"""Lazy CuPy loader: compile ``kernels/<name>.cu`` once per device, launch on torch's stream.

Compiled with NVRTC, ``-std=c++17`` and without ``--use_fast_math`` (the kernels move
bytes and compare integers; nothing may be approximated). CuPy is imported here only,
inside functions, so ``import kernels`` works on a machine without it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from services.common.errors import InvalidArgument

HERE = Path(__file__).resolve().parent
OPTIONS = ("-std=c++17",)
# modules kept in several files, compiled as one source in this order
SOURCES = {"resolver": ("resolver_common.cuh", "resolver_sort.cuh", "resolver_rank.cuh",
                         "resolver_tma.cuh", "resolver_copy.cuh", "resolver_victims.cuh",
                         "resolver_lookup.cu", "resolver_commit.cu", "resolver_promote.cu")}
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


@functools.cache
def capability(device: int) -> tuple[int, int]:
    """The device's compute capability (asked once: the launch wrappers read it every call)."""
    return torch.cuda.get_device_capability(device)


def launch(
    fn: Any, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared: int = 0
) -> None:
    """Launch on ``torch.cuda.current_stream()`` (ordered with the caller's torch work)."""
    import cupy

    dev = torch.cuda.current_device()
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream, dev)
    with cupy.cuda.Device(dev), stream:
        fn(grid, block, args, shared_mem=shared)


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute (cuda.h): 72 bytes
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_ubyte * 4), ("value", ctypes.c_ubyte * 64)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig (cuda.h): 56 bytes
    _fields_ = [
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint),
    ]


PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_CTYPE = {("u", 8): ctypes.c_uint64, ("i", 8): ctypes.c_int64, ("u", 4): ctypes.c_uint32,
          ("i", 4): ctypes.c_int32}


def pdl_enabled() -> bool:
    """``DHISPARSE_PDL`` (1 | 0, default 1): dependent launches use programmatic dependent
    launch (``launch_dependent``); 0 launches them like any other kernel."""
    value = os.environ.get("DHISPARSE_PDL", "1")
    if value not in ("0", "1"):
        raise InvalidArgument(f"DHISPARSE_PDL={value!r} must be 0 or 1")
    return value == "1"


@functools.cache
def _driver() -> Any:
    """libcuda with cuLaunchKernelEx / cuGetErrorName typed, or None where there is none
    (no driver, a driver before CUDA 12)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        ex, name = lib.cuLaunchKernelEx, lib.cuGetErrorName
    except (OSError, AttributeError):
        return None
    ex.restype = name.restype = ctypes.c_int
    ex.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


def _error_name(lib: Any, rc: int) -> str:
    text = ctypes.c_char_p()
    if lib.cuGetErrorName(rc, ctypes.byref(text)) == 0 and text.value:
        return text.value.decode()
    return f"CUresult {rc}"


def kernel_params(args: tuple) -> tuple[Any, list]:
    """``void**`` kernel parameters for numpy scalars (the ctypes values kept alive with it)."""
    values = []
    for a in args:
        kind = np.asarray(a).dtype
        values.append(_CTYPE[(kind.kind, kind.itemsize)](a.item()))
    array = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
    return array, values


def launch_dependent(
    fn: Any, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared: int = 0
) -> bool:
    """Launch right behind the stream's previous kernel with programmatic dependent launch
    (compute capability 9.0+): the grid may be scheduled while that kernel still runs, once
    it executed ``griddepcontrol.launch_dependents``, and must execute
    ``griddepcontrol.wait`` before touching its results (a predecessor that never signals
    counts as signalling when it ends). Returns False after an ordinary ``launch``
    (DHISPARSE_PDL=0, a GPU before Hopper, or no cuLaunchKernelEx in the driver)."""
    dev = torch.cuda.current_device()
    lib = _driver() if pdl_enabled() and capability(dev)[0] >= 9 else None
    if lib is None:
        launch(fn, grid, block, args, shared)
        return False
    import cupy

    dims = (*grid, 1, 1)[:3], (*block, 1, 1)[:3]
    attr = _LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1  # value.programmaticStreamSerializationAllowed (int, little endian)
    cfg = _LaunchConfig(*dims[0], *dims[1], shared, torch.cuda.current_stream().cuda_stream,
                        ctypes.pointer(attr), 1)
    params, keep = kernel_params(args)
    with cupy.cuda.Device(dev):  # the device's context current on this thread, as launch()
        rc = lib.cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(fn.kernel.ptr), params, None)
    del keep
    if rc != 0:
        raise RuntimeError(
            f"cuLaunchKernelEx failed: {_error_name(lib, rc)} (grid={grid}, block={block})")
    return True


def ptr(t: torch.Tensor) -> np.uint64:
    return np.uint64(t.data_ptr())


def vec_width(row_bytes: int, *tensors: torch.Tensor) -> int:
    """Widest access (16, 8 or 4 bytes) dividing the row size and every base address."""
    for w in (16, 8, 4):
        if row_bytes % w == 0 and all(t.data_ptr() % w == 0 for t in tensors):
            return w
    if row_bytes % 4 == 0:
        bad = next(t.data_ptr() for t in tensors if t.data_ptr() % 4)
        raise InvalidArgument(f"a row buffer starts at address {bad:#x}, not 4-byte aligned "
                              f"(row_bytes={row_bytes}); pass an aligned tensor")
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


def check_limit(name: str, value: int, limit: int, minimum: int = 0) -> None:
    """``minimum <= value <= limit`` (the kernels take these as 32-bit counts or sizes)."""
    if value > limit:
        raise InvalidArgument(f"{name}={value} exceeds the kernel limit {limit}")
    if value < minimum:
        raise InvalidArgument(f"{name}={value} is below the minimum {minimum}")
