"""Sparse row gathers from mapped host memory: how the host pool is allocated and how many
rows are in flight change the read rate (the resolver's 20%-miss copies read 410 rows per
request over 160 requests slower than the same row count from 32 dense requests).

For each host allocation (``--modes``: cudaHostRegister of ordinary pages, of transparent
huge pages, cudaHostAlloc), each pattern (``regions`` x ``rows`` per region, a region being
one 100K-row request history, rows sorted by address) and each grid (blocks of
``kernels/copy.cu``'s gather): GB/s of a gather into device memory, every timed call reading
rows no earlier call of the mode read, L2 flushed before each timing; the pinned memcpy of
the same pool in the same run as the ceiling. JSON out, a table printed.
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.common import Flusher, environment, h2d_memcpy_gbps, time_gpu, write_json
from bench.resolver.pool import alloc_host


def anon_huge_kb() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return -1


def thp_setting() -> str:
    try:
        return open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
    except OSError as exc:
        return f"unreadable: {exc}"


class Gather:
    """``dst[i] = src[calls[c][i]]`` on ``grid`` blocks of copy.cu's gather, call ``c``."""

    def __init__(self, fn, grid: int, dst, src, calls, row_bytes: int) -> None:
        self.fn, self.grid, self.dst, self.src, self.calls = fn, grid, dst, src, calls
        self.row_bytes = row_bytes
        self.dst_idx = torch.arange(dst.shape[0], device=dst.device)

    def __call__(self, c: int) -> None:
        import numpy as np

        from kernels._loader import launch, ptr

        n, idx = self.dst_idx.numel(), self.calls[c]
        args = (
            ptr(self.dst),
            ptr(self.dst_idx),
            ptr(self.src),
            ptr(idx),
            np.uint32(n),
            np.uint32(self.row_bytes),
        )
        launch(self.fn, (self.grid,), (256,), args)


class ProbeCall:
    """Call ``c`` of a ``gather_probe`` variant on ``grid`` blocks."""

    def __init__(self, probe, grid: int, dst, src, calls, row_bytes: int) -> None:
        self.probe, self.grid, self.dst, self.src, self.calls = probe, grid, dst, src, calls
        self.row_bytes = row_bytes

    def __call__(self, c: int) -> None:
        self.probe(self.grid, self.dst, self.src, self.calls[c], self.row_bytes)


REGION_ORDERS = ("same", "across", "peer")


def parse_pattern(p: str) -> tuple[int, int, str]:
    """(regions, rows, order) of a pattern: "regions:rows[:order]" -- order "" (each call new
    rows, sorted by address: region after region), "same" (the first call's rows every
    call), "across" (sorted within each region, the regions interleaved: the i-th row of
    every region, then the (i+1)-th) or "peer" (interleaved, each region's rows in random
    order, as one block per request reading in selection order does) -- or
    "pool:rows[:shuffled]" (regions 0: rows from the whole pool, sorted or not)."""
    f = p.split(":")
    if len(f) not in (2, 3):
        raise ValueError(f"pattern={p!r}; expected regions:rows[:order] or pool:rows[:shuffled]")
    order = f[2] if len(f) == 3 else ""
    if f[0] == "pool":
        if order not in ("", "shuffled"):
            raise ValueError(f"pattern={p!r}: a pool pattern takes only :shuffled")
        return 0, int(f[1]), order
    if order not in ("", *REGION_ORDERS):
        raise ValueError(f"pattern={p!r}: a regions pattern's order is one of {REGION_ORDERS}")
    return int(f[0]), int(f[1]), order


def label(nreg: int, nrows: int, order: str) -> str:
    return f"{'pool' if nreg == 0 else nreg:>4} x {nrows:6d}{' ' + order if order else ''}"


def call_rows(perm, nreg: int, nrows: int, order: str, cursor: int, seq_len: int):
    """Pool rows of one call, in the order read: ``nrows`` of each of ``nreg`` regions
    (``perm[r]``: region r's rows in random order; the call takes positions ``cursor ..``
    of it), or with ``nreg`` 0 ``nrows`` of ``perm[0]`` (a permutation of the whole pool)."""
    at = (torch.arange(nrows, device=perm.device) + cursor) % perm.shape[1]
    if nreg == 0:
        rows = perm[0, at]
        return rows if order == "shuffled" else rows.sort().values
    rows = perm[:nreg].gather(1, at.expand(nreg, nrows))
    if order != "peer":  # perm's rows are in random order already
        rows = rows.sort(1).values
    rows = rows + torch.arange(nreg, device=perm.device)[:, None] * seq_len
    if order in ("across", "peer"):
        rows = rows.t()
    return rows.reshape(-1).contiguous()


def command(
    out: str = "bench/results/host_gather_h200.json",
    modes: str = "register,vmm,hostalloc",
    row_bytes: int = 656,
    seq_len: int = 100_000,
    regions: int = 160,
    patterns: str = "1:2048,32:2048,32:410,160:410,160:410:same,32:410:across,32:410:peer",
    grids: str = "16,66,0",
    reps: int = 6,
    variants: str = "",
) -> None:
    """GB/s of sparse, address-sorted host row gathers per allocation, pattern and grid;
    with ``variants`` (comma-separated, ``bench/resolver/gather_probe.py``) each grid is
    timed with each way of reading the rows instead of copy.cu's gather."""
    from bench.resolver import gather_probe
    from kernels._loader import kernel, sm_count

    dev = torch.device("cuda")
    # parse_pattern; "same" rows are remembered only by the translation caches (L2 is
    # flushed); "pool" is the shape of ../shared/reference/h200-host-link-limits.json's gathers
    pats = [parse_pattern(p) for p in patterns.split(",")]
    grid_list = [int(g) for g in grids.split(",")]
    nbytes = regions * seq_len * row_bytes
    rec = {
        "what": "sparse sorted row gathers from mapped host memory (kernels/copy.cu gather_rows)",
        "env": environment() | {"thp": thp_setting()},
        "setup": dict(row_bytes=row_bytes, seq_len=seq_len, regions=regions, pool_bytes=nbytes),
        "rows": [],
    }
    flush = Flusher(dev)
    w = 16 if row_bytes % 16 == 0 else 8
    fn = kernel("copy", f"gather_rows_{w}", dev.index or 0)
    probes = {v: gather_probe.variant(v, dev.index or 0) for v in variants.split(",") if v}
    auto = sm_count(dev.index or 0) * 8
    perm = torch.rand(regions, seq_len, device=dev).argsort(1)
    # a permutation of the whole pool (8 bytes a row), for the pool patterns only
    pool_perm = None
    if any(nreg == 0 for nreg, _, _ in pats):
        pool_perm = torch.randperm(regions * seq_len, device=dev)
    for mode in modes.split(","):
        t0 = time.time()
        huge0 = anon_huge_kb()
        try:
            host_flat, how = alloc_host(nbytes, mode)
        except Exception as exc:  # recorded; the other modes still run
            rec["rows"].append({"mode": mode, "error": f"{type(exc).__name__}: {exc}"})
            continue
        host = host_flat.view(regions * seq_len, row_bytes)
        host_flat[:: 1 << 20].fill_(1)  # touch (pinning already faulted the pages in)
        alloc_s = round(time.time() - t0, 1)
        huge_mb = (anon_huge_kb() - huge0) // 1024
        memcpy = round(h2d_memcpy_gbps(dev, reps=10, src=host_flat), 1)
        print(
            f"{mode}: {nbytes / 1e9:.1f} GB in {alloc_s}s, AnonHugePages +{huge_mb} MB, "
            f"memcpy {memcpy:.1f} GB/s",
            flush=True,
        )
        cursor = pool_cursor = 0
        for (nreg, nrows, order), g, var in (
            (pat, g, v) for pat in pats for g in grid_list for v in (list(probes) or [""])
        ):
            grid = g or auto
            calls = []
            for _ in range(reps + 1):
                if nreg == 0:  # rows from the whole pool
                    calls.append(call_rows(pool_perm[None], 0, nrows, order, pool_cursor, 0))
                    pool_cursor += nrows
                    continue
                calls.append(call_rows(perm, nreg, nrows, order, cursor, seq_len))
                cursor += 0 if order == "same" else nrows
            n = (nreg or 1) * nrows
            dst = torch.empty(n, row_bytes, dtype=torch.uint8, device=dev)
            if var:
                probe = probes[var]
                ts = time_gpu(
                    ProbeCall(probe, grid, dst, host, calls, row_bytes), reps, 1, flush=flush
                )
                ok = gather_probe.check(dst, host, calls[-1])
            else:
                ts = time_gpu(Gather(fn, grid, dst, host, calls, row_bytes), reps, 1, flush=flush)
                ok = torch.equal(dst[-1].cpu(), host[calls[-1][-1].item()].cpu())
            us = statistics.median(ts)
            row = dict(
                variant=var or "copy.cu",
                mode=mode,
                order=order,
                whole_pool=nreg == 0,
                regions=nreg,
                rows=nrows,
                grid=grid,
                us=round(us, 1),
                gbps=round(n * row_bytes / us / 1e3, 1),
                memcpy_gbps=memcpy,
                huge_mb=huge_mb,
                alloc_s=alloc_s,
                last_row_equal=ok,
            )
            row["of_memcpy"] = round(row["gbps"] / memcpy, 3)
            rec["rows"].append(row)
            print(
                f"  {label(nreg, nrows, order)} grid {grid} {var}: "
                f"{us:.1f} us "
                f"{row['gbps']:5.1f} GB/s ({row['of_memcpy']:.0%}) {'' if ok else 'MISMATCH'}",
                flush=True,
            )
        if how.startswith("cudaHostRegister"):
            torch.cuda.cudart().cudaHostUnregister(host_flat.data_ptr())
        del host, host_flat
        write_json(out, rec)
    write_json(out, rec)


if __name__ == "__main__":
    import typer

    typer.run(command)
