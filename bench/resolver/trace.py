"""Where a no-miss resolver call spends its time: launch floors and a phase trace.

    python3 -m bench.resolver.trace --out trace.json      (CUDA only)

1. Floors, timed exactly like the benchmark (L2 flush, GPU spin, CUDA events): one and two
   empty launches, and one thread chasing n dependent pointers through a buffer the flush
   evicted, within one 2 MB page and one page per hop (address translation misses); the
   lookup's random index reads alone (2048 rows of each request's index, P requests).
2. The resolver built with ``DHISPARSE_RESOLVER_TRACE=1``: %globaltimer stamps at the phase
   boundaries of one lookup block, the last lookup block and one commit block (slots of
   resolver_common.cuh's ``TRACE``), on the benchmark's cases (hit100 / miss2 / miss20 /
   cold, 656 B rows, top_k 2048, B 4096, 100K-row requests), beside the event time of the
   same calls and of each launch alone.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from bench.common import Flusher, environment, time_gpu, write_json

FLOOR_SRC = r"""
extern "C" __global__ void empty_kernel() {}
// one thread follows next = buf[next] n times from 0; writes the end so nothing is elided
extern "C" __global__ void chase(const long long* buf, int n, long long* out) {
    long long at = 0;
    for (int i = 0; i < n; ++i) at = buf[at];
    *out = at;
}
// thread i reads buf[idx[i]] (idx read coalesced), like the lookup's hot_index loads, and
// writes it to out[i] so nothing is elided
template <typename T>
__device__ void gather_body(const T* buf, const long long* idx, int n, long long* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (long long)buf[idx[i]];
}
extern "C" __global__ void gather8(const long long* b, const long long* x, int n, long long* o) {
    gather_body(b, x, n, o);
}
extern "C" __global__ void gather4(const int* b, const long long* x, int n, long long* o) {
    gather_body(b, x, n, o);
}
"""

# phase slots of the resolver kernels (lookup block, last block, commit block)
# (slot 2: stamped before pass 1, once the rank form's cache is in shared memory; with the
# index form right after the block's first barrier)
LOOKUP_PHASES = ("pass 1", "rank cache", "hit mask", "miss prefix", "pass 2",
                 "misses+victims", "summary+ticket")


def floors(dev: torch.device, reps: int) -> dict[str, float]:
    import cupy
    import numpy as np

    from kernels._loader import launch, ptr

    mod = cupy.RawModule(code=FLOOR_SRC)
    empty, chase = mod.get_function("empty_kernel"), mod.get_function("chase")
    flush = Flusher(dev)
    out = torch.zeros(1, dtype=torch.int64, device=dev)
    page = 2 << 20
    words = 64 * page // 8  # 128 MB of links
    buf = torch.empty(words, dtype=torch.int64, device=dev)
    res: dict[str, float] = {}

    def med(fn) -> float:
        return statistics.median(time_gpu(lambda i: fn(), reps, 3, flush=flush))

    res["empty_1_launch_us"] = med(lambda: launch(empty, (1,), (1,), ()))
    res["empty_2_launches_us"] = med(lambda: (launch(empty, (1,), (1,), ()),
                                              launch(empty, (1,), (1,), ())))
    res["empty_160x1024_us"] = med(lambda: launch(empty, (160,), (1024,), ()))
    for label, stride in (("same_page", 64), ("new_page", page // 8 + 64)):
        idx = torch.arange(0, 40 * stride, stride, dtype=torch.int64, device=dev)
        buf[idx[:-1]] = idx[1:]
        for n in (1, 4, 16):
            res[f"chase_{n}_{label}_us"] = med(
                lambda n=n: launch(chase, (1,), (1,), (ptr(buf), np.int32(n), ptr(out))))
    # the lookup's hot_index reads alone: 2048 random rows of each of P requests' 100K-row
    # index (int64 [160, 100000] = 128 MB, as the benchmark's), in selection order or sorted
    # within the request, and the same from an int32 index
    rows, k = 100_000, 2048
    gen = torch.Generator(device=dev).manual_seed(0)
    for P in (32, 132, 160):
        pick = torch.rand(P, rows, generator=gen, device=dev).argsort(1)[:, :k]
        pick = pick + torch.arange(P, device=dev)[:, None] * rows
        got = torch.empty(P * k, dtype=torch.int64, device=dev)
        for order, idx in (("shuffled", pick), ("sorted", pick.sort(1).values)):
            idx = idx.flatten().contiguous()
            for name, fn, b in (("int64", "gather8", buf),
                                ("int32", "gather4", buf.view(torch.int32))):
                args = (ptr(b), ptr(idx), np.int32(P * k), ptr(got))
                grid = (-(-P * k // 1024),)
                res[f"gather_{P}x{k}_{order}_{name}_us"] = med(
                    lambda g=mod.get_function(fn), grid=grid, args=args: launch(
                        g, grid, (1024,), args))
    return res


CASES = ((1, "hit100"), (32, "hit100"), (160, "hit100"), (1, "miss2"), (32, "miss2"),
         (1, "cold"), (32, "miss20"), (160, "miss20"))


def traced(dev: torch.device, reps: int, cases=CASES, every_block: bool = False) -> list[dict]:
    """The phase trace of ``cases`` ((batch, profile)), of the first and last request's
    blocks, or of every request's (``every_block``: one traced call each)."""
    import numpy as np

    from bench.resolver.case import Case
    from bench.resolver.pool import State, alloc_host, fill_random, missed_rows
    from kernels._loader import module
    from kernels.resolver import defines, lookup_variant, sm_count

    assert defines() == ("-DRESOLVER_TRACE",)
    P, S, item, k, B = 160, 100_000, 656, 2048, 4096
    host, _ = alloc_host(P * S * item)
    fill_random(host, dev)
    st = State(P, S, B, dev)
    pool = torch.empty(st.pool_rows, item, dtype=torch.uint8, device=dev)
    import cupy

    def globals_of(flags: tuple[str, ...]) -> tuple:  # (g_trace, g_trace_block) of a module
        mod = module("resolver", dev.index or 0, flags)
        return (cupy.ndarray((32,), dtype=np.uint64, memptr=mod.get_global("g_trace")),
                cupy.ndarray((1,), dtype=np.int32, memptr=mod.get_global("g_trace_block")))

    # the commit's stamps (slots 16..23) land in the default module; a lookup built apart
    # (512 threads, lookup_variant: auto's shape above the SM count) stamps its slots in its
    # own module's g_trace
    g_trace, g_block = globals_of(defines())
    sms = sm_count(dev.index or 0)
    flush = Flusher(dev)
    rows = []
    for bs, prof in cases:
        cold = prof == "cold"
        m = missed_rows(prof, k)
        # the lookup's module for this batch: the same arrays as the commit's unless apart
        l_trace, l_block = globals_of(lookup_variant(bs, sms)[1])
        case = Case(st, host, pool, item, bs, 1, k, m, cold)
        ok = case.check(0)["ok"]
        # cold reads a new window of k rows per call: 3 (n + 3) + 2 windows must fit
        n = min(reps, (st.tail_lo // k - 2) // 3 - 3) if cold else reps
        calls = 1 + 3 * (n + 3)
        full = time_gpu(case.call, n, 3, before=case.before, flush=flush)
        look = time_gpu(lambda i, c=case, n=n: c.lookup(i + n + 3), n, 3,
                        before=lambda i, c=case, n=n: c.before(i + n + 3), flush=flush)

        def prep(i: int, c=case, n=n) -> None:  # state restored + lookup done, then flush
            c.before(i + 2 * (n + 3))
            c.lookup(i + 2 * (n + 3))

        commit = time_gpu(lambda i, c=case, n=n: c.commit(i + 2 * (n + 3)), n, 3,
                          before=prep, flush=flush)
        phases = []
        # every request's block, or the first and last request's
        for blk in range(bs) if every_block else sorted({0, bs - 1}):
            for g, b in ((g_trace, g_block), (l_trace, l_block)):
                b[0] = blk
                g[:] = 0
            case.before(calls)
            flush()
            torch.cuda._sleep(1_000_000)
            case.call(calls)
            torch.cuda.synchronize()
            t = [int(a) | int(b) for a, b in zip(g_trace.get(), l_trace.get(), strict=True)]
            t0 = t[0]

            def rel(slot: int, t=t, t0=t0) -> float | None:
                return round((t[slot] - t0) / 1e3, 2) if t[slot] else None

            phases.append({
                "block": blk,
                "lookup_us": {name: rel(i + 1) for i, name in enumerate(LOOKUP_PHASES)},
                "pass_1_us": {"first selected row back": rel(27), "its lookups done": rel(28)},
                "rank_cache_us": {"table row": rel(13), "thread 0's loads": rel(14),
                                  "every thread's loads": rel(15)},
                "miss_path_us": {"misses listed": rel(8), "keys built": rel(9),
                                 "constant bytes": rel(10), "radix passes": rel(11),
                                 "compacted": rel(12)},
                "last_block_us": {"start": rel(24), "end": rel(25)},
                "commit_us": {"start": rel(16), "table row back": rel(23),
                              "summary word back": rel(20),
                              "pending word back": rel(21), "hit-mask word back": rel(22),
                              "totals read": rel(17),
                              "summary read": rel(18), "stamped": rel(19)},
            })
        rows.append({"batch": bs, "profile": prof, "ok": ok,
                     "call_us": statistics.median(full),
                     "lookup_alone_us": statistics.median(look),
                     "commit_alone_us": statistics.median(commit), "trace": phases})
        print(rows[-1], flush=True)
        del case
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="trace.json")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--cases", default=",".join(f"{b}:{p}" for b, p in CASES),
                    help="batch:profile, comma-separated")
    ap.add_argument("--every-block", action="store_true",
                    help="trace every request's block (a call each), not the first and last")
    ap.add_argument("--no-floors", action="store_true", help="skip the launch floors")
    a = ap.parse_args()
    cases = [(int(b), p) for b, p in (c.split(":") for c in a.cases.split(","))]
    os.environ["DHISPARSE_RESOLVER_TRACE"] = "1"
    dev = torch.device("cuda")
    rec: dict = {"env": environment()}
    if not a.no_floors:
        rec["floors"] = floors(dev, a.reps)
        print(rec["floors"], flush=True)
        write_json(a.out, rec)
    rec["traced"] = traced(dev, a.reps, cases, a.every_block)
    write_json(a.out, rec)


if __name__ == "__main__":
    main()
