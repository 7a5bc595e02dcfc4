"""What the single launch of a no-miss round costs, piece by piece (CUDA only):

    python3 -m bench.resolver.one_launch_probe --out probe.json

Times (as the benchmark: L2 flush, GPU spin, CUDA events) the no-miss round of 656 B rows,
top_k 2048, B 4096 at batch 1 / 8 / 32 as two launches and as the fused kernel launched
cooperatively or plainly, with one block per SM or with the request blocks only (no
copy blocks: nothing to copy without misses), beside empty launches of the same shapes.
Then where the fixed cost comes from: the same rounds with the kernels' code warm (one
round of a separate one-request case runs between the flush and the timed call: code in
L2, the timed case's data still cold) and with nothing flushed.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from bench.common import SPIN_CYCLES, Flusher, environment, time_gpu, write_json

SHAPE = (32, 100_000, 656, 2048, 4096)  # requests, rows per request, row bytes, top_k, B
EMPTY_SRC = r"""extern "C" __global__ void __launch_bounds__(1024) empty_kernel() {}"""


def empty_floors(dev: torch.device, reps: int, sms: int) -> dict[str, float]:
    import cupy

    from kernels._loader import launch, launch_cooperative

    fn = cupy.RawModule(code=EMPTY_SRC).get_function("empty_kernel")
    flush = Flusher(dev)

    def med(go) -> float:
        return statistics.median(time_gpu(lambda i: go(), reps, 3, flush=flush))

    return {
        "empty_1x1_plain_us": med(lambda: launch(fn, (1,), (1,), ())),
        f"empty_{sms}x1024_plain_us": med(lambda: launch(fn, (sms,), (1024,), ())),
        f"empty_{sms}x1024_cooperative_us": med(
            lambda: launch_cooperative(fn, (sms,), (1024,), ())),
        "empty_1x1024_cooperative_us": med(lambda: launch_cooperative(fn, (1,), (1024,), ())),
    }


def rounds(dev: torch.device, reps: int, host: torch.Tensor) -> list[dict]:
    from bench.resolver.case import Case
    from bench.resolver.pool import State
    from kernels import _loader
    from kernels import resolver_round as rr

    P, S, item, k, B = SHAPE
    st = State(P, S, B, dev)
    pool = torch.empty(st.pool_rows, item, dtype=torch.uint8, device=dev)
    flush = Flusher(dev)
    real_grid, real_launch = rr.one_launch_grid, rr.launch_cooperative

    def requests_only(batch: int, layers: int, sms: int) -> int:
        return batch
    variants = {
        "two_launches": (False, real_grid, real_launch),
        "one_coop_all_sms": (True, real_grid, real_launch),
        "one_coop_request_blocks": (True, requests_only, real_launch),
        "one_plain_all_sms": (True, real_grid, _loader.launch),
        "one_plain_request_blocks": (True, requests_only, _loader.launch),
    }
    out = []
    for bs in (1, 8, 32):
        case = Case(st, host, pool, item, bs, 1, k, 0, False)
        row: dict = {"batch": bs, "ok": case.check(0)["ok"]}
        for name, (one, grid, go) in variants.items():
            rr.one_launch_grid, rr.launch_cooperative = grid, go
            case.one_launch = one
            try:
                ts = time_gpu(case.call, reps, 3, before=case.before, flush=flush)
                row[name] = round(statistics.median(ts), 2)
            finally:
                rr.one_launch_grid, rr.launch_cooperative = real_grid, real_launch
        print(row, flush=True)
        out.append(row)
    return out


def time_warm(case, warm, reps: int, flush) -> float:
    """Median µs of ``case.call(i)`` with ``warm.call(0)`` (if any) run after the flush
    (if any) and the spin, right before the start event."""
    for i in range(3):
        case.before(i)
        case.call(i)
    torch.cuda.synchronize()
    events = []
    for i in range(3, 3 + reps):
        case.before(i)
        if warm is not None:
            warm.before(0)
        if flush is not None:
            flush()
        torch.cuda._sleep(SPIN_CYCLES)
        if warm is not None:
            warm.call(0)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        case.call(i)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return round(statistics.median(s.elapsed_time(e) * 1e3 for s, e in events), 2)


def code_warm(dev: torch.device, reps: int, host: torch.Tensor) -> list[dict]:
    from bench.resolver.case import Case
    from bench.resolver.pool import State

    P, S, item, k, B = SHAPE
    st, st_warm = State(P, S, B, dev), State(1, S, B, dev)
    pool = torch.empty(st.pool_rows, item, dtype=torch.uint8, device=dev)
    pool_warm = torch.empty(st_warm.pool_rows, item, dtype=torch.uint8, device=dev)
    flush = Flusher(dev)
    out = []
    for bs in (1, 32):
        case = Case(st, host, pool, item, bs, 1, k, 0, False)
        warm = Case(st_warm, host[: S * item], pool_warm, item, 1, 1, k, 0, False)
        warm.sel(0)
        row: dict = {"batch": bs}
        for one in (False, True):
            case.one_launch = warm.one_launch = one
            tag = "one" if one else "two"
            row[f"{tag}_flushed"] = time_warm(case, None, reps, flush)
            row[f"{tag}_code_warm"] = time_warm(case, warm, reps, flush)
            row[f"{tag}_not_flushed"] = time_warm(case, None, reps, None)
        print(row, flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="probe.json")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    dev = torch.device("cuda")
    from kernels._loader import sm_count

    rec: dict = {"env": environment()}
    rec["floors"] = empty_floors(dev, a.reps, sm_count(0))
    print(rec["floors"], flush=True)
    write_json(a.out, rec)
    from bench.resolver.pool import alloc_host, fill_random

    P, S, item = SHAPE[:3]
    host, _ = alloc_host(P * S * item)  # one pool: a segment registers once per process
    fill_random(host, dev)
    rec["code_warm"] = code_warm(dev, a.reps, host)
    write_json(a.out, rec)
    rec["rounds"] = rounds(dev, a.reps, host)
    write_json(a.out, rec)


if __name__ == "__main__":
    main()
