"""Every CUDA source the wrappers and the benchmark probes load compiles under NVRTC (the
compiler CuPy runs on the GPU machine) with each build's defines, and holds every kernel
the Python side launches by name. CPU: NVRTC makes PTX without a GPU, so this is where an
edit that breaks a kernel's compilation shows in CI (which has none). Skipped where the
``nvidia-cuda-nvrtc`` wheel of the ``test`` extra is missing."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from kernels._loader import HERE, OPTIONS, source
from tests.kernels.nvrtc import ARCH, compile_ptx, library, version

pytestmark = [
    pytest.mark.skipif(library() is None, reason="nvidia-cuda-nvrtc not installed"),
    # 13.0 (the one CUDA 13.0 builds of torch bring) rejects generic lambdas in device code
    # without -default-device; the test extra's 13.2.86 compiles the sources as CuPy does
    pytest.mark.skipif(library() is not None and version() < (13, 2),
                       reason="NVRTC older than 13.2 (the test extra pins 13.2.86)"),
]

WIDTHS = (16, 8, 4)
LOOKUPS = {f"resolve_lookup{shape}{form}{q}" for shape in ("", "_2") for form in ("", "_rank")
           for q in ("", "_q")}
RESOLVER_KERNELS = (LOOKUPS | {f"resolve_commit_{w}" for w in WIDTHS} | {"resolve_commit_16_tma"}
                    | {f"{k}_{w}" for k in ("plan_copy", "promote_staged") for w in WIDTHS})
COPY_KERNELS = {f"{k}_{w}" for k in ("gather_rows", "gather_layers", "ring_write", "commit_rows")
                for w in WIDTHS}


def resolver_builds(monkeypatch) -> list[tuple[str, ...]]:
    """The resolver's builds: every lookup shape's (``lookup_variant``), the switches of
    ``kernels.resolver_settings.defines`` and every diagnostic build of
    ``bench.resolver.tma_cost``."""
    from bench.resolver.tma_cost import VARIANTS
    from kernels.resolver import lookup_variant
    from kernels.resolver_settings import LOOKUP_SHAPES

    builds = {("-DRESOLVER_TRACE",), ("-DRESOLVER_TMA_PRELOAD",)}
    for shape in LOOKUP_SHAPES:
        monkeypatch.setenv("DHISPARSE_LOOKUP_BLOCKS", shape)
        builds.add(lookup_variant()[1])
    builds |= {v.flags for v in VARIANTS.values()}
    return sorted(builds)


def _compile(job: tuple[str, str, tuple[str, ...]]) -> tuple[str, tuple[str, ...], int, str, set]:
    what, src, flags = job
    return (what, flags, *compile_ptx(src, (*OPTIONS, ARCH, *flags)))


def test_every_kernel_source_compiles_under_nvrtc_with_each_builds_defines(monkeypatch) -> None:
    from bench.resolver import hit_forms, trace

    for var in ("DHISPARSE_RESOLVER_TRACE", "DHISPARSE_RESOLVER_LINEINFO",
                "DHISPARSE_RESOLVER_TMA_PRELOAD"):
        monkeypatch.delenv(var, raising=False)
    builds = resolver_builds(monkeypatch)
    assert () in builds and ("-DNT=512",) in builds
    jobs = [("resolver", source("resolver"), flags) for flags in builds]
    jobs += [("copy", source("copy"), ()),
             ("gather_probe", (HERE.parent / "bench/resolver/gather_probe.cu").read_text(), ()),
             ("trace floors", trace.FLOOR_SRC, ()),
             ("hit_forms", hit_forms.SRC,
              ("-DNT=1024", "-DNWORD=3125", "-DNSLOT=4096", "-DNSEL=2048"))]
    assert len(jobs) >= 10  # the diagnostic builds are there to check
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(_compile, jobs))
    for what, flags, rc, log, entries in results:
        assert rc == 0, f"{what} {flags}: NVRTC {version()} result {rc}\n{log[:3000]}"
        assert entries, (what, flags)
        want = {"resolver": RESOLVER_KERNELS, "copy": COPY_KERNELS}.get(what, set())
        assert want <= entries, (what, flags, sorted(want - entries))


def test_a_source_that_does_not_compile_is_reported_with_its_log() -> None:
    rc, log, entries = compile_ptx('extern "C" __global__ void k() { undeclared(); }',
                                   (*OPTIONS, ARCH))
    assert rc != 0 and "undeclared" in log and not entries
    rc, log, entries = compile_ptx('extern "C" __global__ void k(int* p) { *p = 1; }',
                                   (*OPTIONS, ARCH))
    assert rc == 0 and entries == {"k"}
