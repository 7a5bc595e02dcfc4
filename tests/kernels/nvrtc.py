"""NVRTC, the compiler CuPy runs on the GPU machine, called through ctypes on any machine:
it turns CUDA C++ into PTX without a GPU. The library comes from the ``nvidia-cuda-nvrtc``
wheel (the ``test`` extra); ``library()`` is None where it is missing."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import re
from pathlib import Path

ARCH = "-arch=compute_90"  # the H200's; CuPy passes the device's own
_ENTRY = re.compile(r"^\.(?:visible )?\.entry (\w+)\(", re.M)


@functools.cache
def library() -> ctypes.CDLL | None:
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec else ():
        for lib in sorted(Path(root).glob("cu*/lib/libnvrtc.so.*")):
            if re.fullmatch(r"libnvrtc\.so\.\d+", lib.name):
                return ctypes.CDLL(str(lib))
    return None


def version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def compile_ptx(source: str, options: tuple[str, ...]) -> tuple[int, str, set[str]]:
    """(NVRTC's result code, its log, the PTX's kernel entry names) of ``source``."""
    lib = library()
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"source.cu", 0, None, None)
    if rc != 0:
        return rc, "nvrtcCreateProgram failed", set()
    try:
        opts = [o.encode() for o in options]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        entries: set[str] = set()
        if rc == 0:
            lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
            ptx = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetPTX(prog, ptx)
            entries = set(_ENTRY.findall(ptx.value.decode()))
        return rc, log.value.decode(errors="replace"), entries
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
