"""CUDA registration of mapped host memory (``cudaHostRegister``, mapped + portable).

Imported lazily and only used when ``torch.cuda.is_available()``: registering the
segment page-locks it and maps it into the device address space, so kernels read host
rows directly (zero-copy, DESIGN.md §4). With unified addressing the device pointer of a
registered range equals its host pointer (``cudaDevAttrCanUseHostPointerForRegisteredMem``
is 1 on x86-64 Linux); ``cuda.bindings`` (cuda-python) is asked for it when installed.
"""

from __future__ import annotations

from typing import Any

import torch

from services.common.errors import FailedPrecondition

HOST_REGISTER_PORTABLE = 1
HOST_REGISTER_MAPPED = 2


def register(ptr: int, nbytes: int) -> int:
    """Page-lock and map ``[ptr, ptr + nbytes)``; returns the device pointer."""
    err = torch.cuda.cudart().cudaHostRegister(
        ptr, nbytes, HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED)
    if int(err) != 0:
        raise FailedPrecondition(f"cudaHostRegister({nbytes} bytes) failed: error {int(err)}")
    try:  # optional: ask the runtime for the exact device pointer
        from cuda.bindings import runtime
    except ImportError:
        return ptr  # unified addressing: the host pointer is valid on the device
    err, dev_ptr = runtime.cudaHostGetDevicePointer(ptr, 0)
    if int(err) != 0:
        raise FailedPrecondition(f"cudaHostGetDevicePointer failed: error {int(err)}")
    return int(dev_ptr)


def unregister(ptr: int) -> None:
    err = torch.cuda.cudart().cudaHostUnregister(ptr)
    if int(err) != 0:
        raise FailedPrecondition(f"cudaHostUnregister failed: error {int(err)}")


class _DeviceArray:
    """Just enough ``__cuda_array_interface__`` for ``torch.as_tensor`` to wrap a pointer."""

    def __init__(self, ptr: int, shape: tuple[int, ...], owner: Any) -> None:
        self._owner = owner  # keeps the mapping alive as long as the tensor
        self.__cuda_array_interface__ = {
            "data": (ptr, False), "shape": shape, "typestr": "|u1", "version": 3,
            "strides": None}


def device_view(dev_ptr: int, shape: tuple[int, int], owner: Any) -> torch.Tensor:
    """A ``uint8`` CUDA tensor over registered host memory (no copy)."""
    return torch.as_tensor(_DeviceArray(dev_ptr, shape, owner), device="cuda")
