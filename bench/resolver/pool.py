"""Resolver benchmark setup: the page-locked host pool and the hot caches of the requests.

Host rows: one page-locked, mapped pool; request r's history is rows [r*S, (r+1)*S) of it.
``State`` holds P requests' hot caches and tables, and picks each call's selection (resident
rows plus a window of never-read rows).
"""

from __future__ import annotations

import mmap
import os

import torch

from kernels.resolver import table_row
from services.decode.hierarchy.request import (
    HOT_SLOT_BITS,
    RANK_VERSION,
    new_rank_cache,
    rank_words,
)

PROFILES = {"hit100": 0.0, "miss2": 0.02, "miss20": 0.20, "cold": 1.0}


def missed_rows(profile: str, k: int) -> int:
    """Never-read rows per request and call in a selection of ``k`` under ``profile``."""
    return round(PROFILES[profile] * k)


PAGE_ROWS, TAIL_ROWS, STAGING_ROWS = 64, 72, 4096


HOST_MODES = ("register", "thp", "hostalloc", "vmm", "shm")


def alloc_host(nbytes: int, mode: str | None = None) -> tuple[torch.Tensor, str]:
    """Page-locked host pool the GPU reads in place, allocated by ``mode`` (default
    ``DHISPARSE_BENCH_HOST`` or "register"): cudaHostRegister(Mapped) of torch.empty's
    pages ("register", as the peer harness does), of an mmap advised to transparent huge
    pages ("thp"),
    cudaHostAlloc ("hostalloc", torch's pinned allocator), host memory of the CUDA virtual
    memory API mapped at its 2 MB granularity ("vmm": a CUDA-typed tensor), or a kvstore
    segment ("shm": ``services.kvstore.segments.Segment`` in ``DHISPARSE_BENCH_SHM_DIR``,
    default /dev/shm, registered like the decode worker registers one; the file is unlinked
    at once, the mapping lives with the tensor)."""
    mode = mode or os.environ.get("DHISPARSE_BENCH_HOST", "register")
    if mode not in HOST_MODES:
        raise ValueError(f"host allocation mode={mode!r}; expected one of {HOST_MODES}")
    if mode == "vmm":
        from bench.resolver.vmm_host import alloc_vmm_host

        return alloc_vmm_host(nbytes)
    if mode == "hostalloc":
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), "cudaHostAlloc"
    if mode == "shm":
        from pathlib import Path

        from services.kvstore.segments import Segment

        shm_dir = Path(os.environ.get("DHISPARSE_BENCH_SHM_DIR", "/dev/shm"))
        seg = Segment.create(shm_dir / f"dhisparse-bench-{os.getpid()}", nbytes)
        seg.path.unlink()
        t = torch.frombuffer(seg.view(), dtype=torch.uint8)
        from services.kvstore.cuda import register

        register(t.data_ptr(), nbytes)  # portable + mapped, as the decode worker does
        return t, f"kvstore segment in {shm_dir}, cudaHostRegister(Portable | Mapped)"
    elif mode == "thp":
        buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf.madvise(getattr(mmap, "MADV_HUGEPAGE", 14))
        t = torch.frombuffer(buf, dtype=torch.uint8)
    else:
        t = torch.empty(nbytes, dtype=torch.uint8)
    rc = int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 2))  # Mapped
    how = "cudaHostRegister(Mapped)" + (" of madvise(MADV_HUGEPAGE) pages" if mode == "thp" else "")
    if rc == 0:
        return t, how
    if mode == "thp":
        raise RuntimeError(f"{how} failed rc={rc}")
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), f"pin_memory (register rc={rc})"


def fill_random(host: torch.Tensor, dev: torch.device, chunk: int = 1 << 30) -> None:
    g = torch.empty(min(chunk, host.numel()), dtype=torch.uint8, device=dev)
    for off in range(0, host.numel(), chunk):
        n = min(chunk, host.numel() - off)
        g[:n].random_()
        host[off : off + n].copy_(g[:n])
    torch.cuda.synchronize()


def windows_of(S: int, B: int, k: int, m: int, cold: bool) -> int:
    """``State.windows`` of a state of ``S``-row requests and ``B`` hot slots, before one
    is built: the rows below the tail, less the ``B`` resident ones where calls are warm."""
    tail_lo = (S - 1) // PAGE_ROWS * PAGE_ROWS
    if cold:
        return tail_lo // k
    return (tail_lo - B) // m if m else 1 << 30


class State:
    """Hot caches of P requests (one tensor per field, a row per request) and their tables."""

    def __init__(self, P: int, S: int, B: int, dev: torch.device) -> None:
        self.P, self.S, self.B = P, S, B
        self.tail_lo = (S - 1) // PAGE_ROWS * PAGE_ROWS  # rows below it go through steps 2-3
        order = torch.rand(P, self.tail_lo, device=dev).argsort(1)
        self.res, self.nonres = order[:, :B].contiguous(), order[:, B:].contiguous()
        self.cold_order = order  # cold: any row, call i takes window i
        self.hot_pick = torch.rand(P, B, device=dev).argsort(1)
        i64 = dict(dtype=torch.int64, device=dev)
        self.hot_rows = torch.empty(P, B, **i64)
        self.stamp = torch.empty(P, B, **i64)
        self.hot_locs = torch.arange(P * B, **i64).view(P, B)
        self.hot_index = torch.full((P, S), -1, **i64)  # row -> packed hot slot (request.py)
        self.hot_rank = new_rank_cache(S, B, dev, P)  # the rank form's cache (request.py)
        self.held_changed = True  # set by calls with misses (Case.call), cleared by restore
        self.last_cold: bool | None = None  # the kind of the last restore (warm / cold)
        self.res_index = self.hot_locs << HOT_SLOT_BITS | torch.arange(B, **i64)
        self.tail_locs = torch.arange(P * B, P * B + P * TAIL_ROWS, **i64).view(P, TAIL_ROWS)
        pages = -(-S // PAGE_ROWS)
        self.page_map = torch.full((P, pages), -1, **i64)
        self.page_ready = torch.zeros(P, pages, dtype=torch.bool, device=dev)
        # LRU order = slot order; every stamp an epoch whose readers finished: no
        # slot is protected (request.py), the calls' epoch is past them all
        self.stamp0 = torch.arange(1, B + 1, **i64).repeat(P, 1)
        self.finished_epoch, self.epoch = B, B + 1
        self.stage_locs = torch.arange(
            P * B + P * TAIL_ROWS, P * B + P * TAIL_ROWS + STAGING_ROWS, **i64
        )
        self.pool_rows = P * B + P * TAIL_ROWS + STAGING_ROWS

    def windows(self, k: int, m: int, cold: bool) -> int:
        """Calls (of ``k``-row selections, ``m`` never-read rows per request) this state
        serves before a row is read twice: cold calls take ``k`` rows of any kind."""
        return windows_of(self.S, self.B, k, m, cold)

    def table(self, bs: int) -> torch.Tensor:
        rows = [
            table_row(
                hot_rows=self.hot_rows[r].data_ptr(),
                hot_stamp=self.stamp[r].data_ptr(),
                hot_locs=self.hot_locs[r].data_ptr(),
                tail_locs=self.tail_locs[r].data_ptr(),
                page_map=self.page_map[r].data_ptr(),
                page_ready=self.page_ready[r].data_ptr(),
                hot_index=self.hot_index[r].data_ptr(),
                hot_rank=self.hot_rank[r].data_ptr(),
                rank_cap=rank_words(self.S),
                tail_lo=self.tail_lo,
                tail_hi=self.S,
                map_hi=0,  # page_map is -1 throughout: no optional or history pages
            )
            for r in range(bs)
        ]
        return torch.tensor(rows, dtype=torch.int64, device=self.hot_rows.device)

    def restore(self, cold: bool) -> None:
        """The hot cache as the cases start it. Where a call since the last restore changed
        which rows are held (``held_changed``: misses took slots), or where this restore
        changes them (warm after cold or the other way), the rank form's cache goes stale, as
        every writer of hot_rows makes it; after calls without misses it stays valid, as in
        serving."""
        if self.held_changed or cold != self.last_cold:  # calls or this restore change them
            self.hot_rank[:, RANK_VERSION] += 1
            self.held_changed = False
        self.last_cold = cold
        self.hot_index.fill_(-1)
        if cold:
            self.hot_rows.fill_(-1)
            self.stamp.zero_()
        else:
            self.hot_rows.copy_(self.res)
            self.hot_index.scatter_(1, self.res, self.res_index)
            self.stamp.copy_(self.stamp0)

    def selection(self, bs: int, K: int, k: int, m: int, i: int, cold: bool) -> torch.Tensor:
        """[bs, K, k]: k - m resident rows + this call's window of m never-read rows (shuffled);
        with K > 1 every query repeats query 0 (identical selections)."""
        if cold:
            sel = self.cold_order[:bs, i * k : (i + 1) * k]
        else:
            hits = self.res[:bs].gather(1, self.hot_pick[:bs, : k - m])
            sel = torch.cat([hits, self.nonres[:bs, i * m : (i + 1) * m]], 1)
            sel = sel.gather(1, torch.rand(bs, k, device=sel.device).argsort(1))
        return sel[:, None, :].expand(bs, K, k).contiguous()


class Windows:
    """Row windows of a sweep's timed calls, per case key: each setting takes the next ``n``
    windows no earlier setting of the case read, starting over at window 0 once the case has
    too few left (the sweeps flush L2 before each timing). More than a case has is refused."""

    def __init__(self) -> None:
        self._next: dict[object, int] = {}

    def take(self, key: object, n: int, have: int) -> int:
        if n > have:
            raise ValueError(f"{n} calls need more row windows than the {have} of case {key}")
        off = self._next.get(key, 0)
        if off + n > have:
            off = 0
        self._next[key] = off + n
        return off
