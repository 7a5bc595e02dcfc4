"""Host memory through the CUDA virtual memory API (cuMemCreate on the host, mapped into the
GPU's address space at the allocation granularity), for the benchmark's host-pool probe:
the GPU translates it with large pages, where cudaHostRegister'ed pages may be small.

``alloc_vmm_host(nbytes)`` returns a CUDA-typed uint8 tensor over the mapping (the GPU reads
and writes it; the CPU does not touch it here) and a description. The mapping lives as long
as the tensor (a finalizer unmaps and releases it).
"""

from __future__ import annotations

import ctypes
import weakref

import torch

LOC_HOST, LOC_HOST_NUMA, LOC_DEVICE = 2, 3, 1
ALLOC_PINNED, PROT_RW, GRAN_RECOMMENDED = 1, 3, 1


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _Prop(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _Access(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


def _check(lib, rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: {(name.value or b'?').decode()} ({rc})")


def alloc_vmm_host(nbytes: int, numa: bool = True) -> tuple[torch.Tensor, str]:
    import cupy

    lib = ctypes.CDLL("libcuda.so.1")
    dev = torch.cuda.current_device()
    torch.cuda.init()
    prop = _Prop(type=ALLOC_PINNED, location=_Location(LOC_HOST_NUMA if numa else LOC_HOST, 0))
    gran = ctypes.c_size_t()
    with cupy.cuda.Device(dev):
        _check(
            lib,
            lib.cuMemGetAllocationGranularity(
                ctypes.byref(gran), ctypes.byref(prop), GRAN_RECOMMENDED
            ),
            "granularity",
        )
        g = gran.value
        size = -(-nbytes // g) * g
        handle = ctypes.c_ulonglong()
        _check(
            lib,
            lib.cuMemCreate(
                ctypes.byref(handle),
                ctypes.c_size_t(size),
                ctypes.byref(prop),
                ctypes.c_ulonglong(0),
            ),
            "cuMemCreate(host)",
        )
        va = ctypes.c_ulonglong()
        _check(
            lib,
            lib.cuMemAddressReserve(
                ctypes.byref(va),
                ctypes.c_size_t(size),
                ctypes.c_size_t(g),
                ctypes.c_ulonglong(0),
                ctypes.c_ulonglong(0),
            ),
            "cuMemAddressReserve",
        )
        _check(
            lib,
            lib.cuMemMap(
                va, ctypes.c_size_t(size), ctypes.c_size_t(0), handle, ctypes.c_ulonglong(0)
            ),
            "cuMemMap",
        )
        acc = _Access(location=_Location(LOC_DEVICE, dev), flags=PROT_RW)
        _check(
            lib,
            lib.cuMemSetAccess(va, ctypes.c_size_t(size), ctypes.byref(acc), ctypes.c_size_t(1)),
            "cuMemSetAccess",
        )
    mem = cupy.cuda.UnownedMemory(va.value, size, None, dev)
    arr = cupy.ndarray((nbytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))
    t = torch.from_dlpack(arr)

    def release(va=va.value, size=size, handle=handle.value) -> None:
        lib.cuMemUnmap(ctypes.c_ulonglong(va), ctypes.c_size_t(size))
        lib.cuMemAddressFree(ctypes.c_ulonglong(va), ctypes.c_size_t(size))
        lib.cuMemRelease(ctypes.c_ulonglong(handle))

    weakref.finalize(t, release)
    kind = "HOST_NUMA 0" if numa else "HOST"
    return t, f"cuMemCreate({kind}) mapped at {g >> 20} MiB granularity"
