"""Shared benchmark timer and record keeping: CUDA events, warm-up, median, L2 flush, JSON.

``time_gpu`` times only the call: per repetition it runs ``before`` (restore state), flushes
L2 (a 256 MB write, > the H200's 60 MB L2), queues a GPU spin so the host launch latency
hides behind it, then records CUDA events around ``call`` alone.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from services.decode.bench.report import git_sha

FLUSH_BYTES = 256 << 20
SPIN_CYCLES = 1_000_000  # ~0.5 ms at 1.98 GHz: longer than any host launch sequence here


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {
        "git_sha": git_sha(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            sms=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
        )
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except ImportError:
        info["cupy"] = None
    return info


class Flusher:
    """Evicts L2 by writing a scratch buffer larger than it."""

    def __init__(self, device: torch.device, nbytes: int = FLUSH_BYTES) -> None:
        self.scratch = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.scratch.zero_()


def time_gpu(
    call: Callable[[int], Any],
    reps: int,
    warmup: int,
    before: Callable[[int], Any] | None = None,
    flush: Callable[[], None] | None = None,
    spin: int = SPIN_CYCLES,
) -> list[float]:
    """Microseconds of ``call(i)`` for i in [warmup, warmup + reps); ``before(i)`` and the
    flush run before the start event. ``i`` lets every call use its own inputs."""
    for i in range(warmup):
        if before:
            before(i)
        call(i)
    torch.cuda.synchronize()
    events = []
    for i in range(warmup, warmup + reps):
        if before:
            before(i)
        if flush:
            flush()
        torch.cuda._sleep(spin)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call(i)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in events]


def time_wall(
    call: Callable[[int], Any],
    indices: Sequence[int],
    before: Callable[[int], Any] | None = None,
    flush: Callable[[], None] | None = None,
) -> list[float]:
    """Host microseconds of ``call(i)`` + synchronize (launch overhead included)."""
    out = []
    for i in indices:
        if before:
            before(i)
        if flush:
            flush()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call(i)
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def summarize(ts: Sequence[float]) -> dict[str, float]:
    q = sorted(ts)
    pick = lambda f: q[min(len(q) - 1, int(f * (len(q) - 1) + 0.5))]
    return {
        "median": statistics.median(q),
        "p10": pick(0.1),
        "p90": pick(0.9),
        "min": q[0],
        "n": len(q),
    }


def h2d_memcpy_gbps(device: torch.device, nbytes: int = 1 << 30, reps: int = 20,
                    src: torch.Tensor | None = None) -> float:
    """Pinned host -> device ``cudaMemcpyAsync`` of one large buffer: the host-link ceiling
    (of the first ``nbytes`` of ``src`` when given: that allocation's ceiling; all of it
    where it holds fewer bytes)."""
    if src is not None:
        if not src.is_contiguous():  # a reshape would copy it into unpinned memory
            raise ValueError(f"src of shape {tuple(src.shape)} is not contiguous")
        nbytes = min(nbytes, src.numel() * src.element_size())
    if nbytes <= 0:
        raise ValueError(f"nbytes={nbytes}: the memcpy needs at least 1 byte")
    if src is None:
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        host.fill_(7)
    else:
        host = src.reshape(-1).view(torch.uint8)[:nbytes]
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    ts = time_gpu(lambda _: dev.copy_(host, non_blocking=True), reps, 3, spin=0)
    return nbytes / (statistics.median(ts) * 1e-6) / 1e9


def write_json(path: str | Path, record: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    os.replace(tmp, path)
