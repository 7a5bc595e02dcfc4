"""How a lookup block can find its hot hits, alone in a kernel (no direct path, no misses).

    python3 -m bench.resolver.hit_forms --out hit_forms.json      (CUDA only)

P requests, one block each, 2048 selected rows per request, every one held by one of the
B = 4096 hot slots of a 100K-row history; each form writes the selected rows' pool
locations. Timed like the benchmark (L2 flush, GPU spin, CUDA events, median):

- ``index``: one load of the request's row -> slot index per selected row (the lookup's
  pass 1 today: a random 32-byte sector of an 800 KB array each);
- ``fly``: the request's ``hot_rows`` / ``hot_locs`` read in slot order (coalesced, every
  load issued at once), a bitmap of the held rows built in shared memory, its per-word
  prefix of set bits, each slot's packed location placed at its row's rank; a selected
  row's location is then the entry at its rank (no per-row global load);
- ``bits``: the same with the bitmap and the rank-ordered locations kept in device memory
  (what a persistent form would read): no build, only the prefix.

All three must agree (checked on the GPU before timing).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from bench.common import Flusher, environment, time_gpu, write_json

SRC = r"""
typedef long long i64;
#define HOT_SLOT_BITS 20
#define WPT ((NWORD + NT - 1) / NT)  // bitmap words per thread
#define SPT ((NSLOT + NT - 1) / NT)  // slots per thread
#define EPT ((NSEL + NT - 1) / NT)   // selected rows per thread

// exclusive prefix over the block of v (every thread calls it)
__device__ unsigned block_scan(unsigned v, unsigned* tmp) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) tmp[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        unsigned t = lane < NT / 32 ? tmp[lane] : 0u, ti = t;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned y = __shfl_up_sync(0xffffffffu, ti, o);
            if (lane >= o) ti += y;
        }
        tmp[lane] = ti - t;
    }
    __syncthreads();
    return incl - v + tmp[warp];
}

// per-word prefix of set bits: thread t sums words [t * WPT, t * WPT + WPT)
__device__ void bit_prefix(const unsigned* bm, unsigned* pre, unsigned* tmp) {
    const int lo = threadIdx.x * WPT;
    unsigned c[WPT], s = 0;
#pragma unroll
    for (int j = 0; j < WPT; ++j) s += (c[j] = lo + j < NWORD ? __popc(bm[lo + j]) : 0u);
    unsigned run = block_scan(s, tmp);
#pragma unroll
    for (int j = 0; j < WPT; ++j)
        if (lo + j < NWORD) pre[lo + j] = run, run += c[j];
}

__device__ __forceinline__ unsigned rank_of(const unsigned* bm, const unsigned* pre, unsigned r) {
    const unsigned w = r >> 5, below = (1u << (r & 31)) - 1u;
    return pre[w] + __popc(bm[w] & below);
}

// the rank forms' shared memory: entries by rank [NSLOT], bitmap [NWORD], its prefix
#define SHARED_LAYOUT                                                   \
    extern __shared__ __align__(16) unsigned char smem[];               \
    __shared__ unsigned tmp[32];                                        \
    i64* packed = reinterpret_cast<i64*>(smem);                         \
    unsigned* bm = reinterpret_cast<unsigned*>(packed + NSLOT);         \
    unsigned* pre = bm + NWORD;                                         \
    const i64 b = blockIdx.x;

// each selected row's location: the entry at its rank where its bit is set, else -1
__device__ void emit_hits(const unsigned* bm, const unsigned* pre, const i64* packed,
                          const i64* r, i64* out) {
#pragma unroll
    for (int q = 0; q < EPT; ++q) {
        const int e = threadIdx.x + q * NT;
        if (e >= NSEL) continue;
        const unsigned rr = (unsigned)r[q];
        const bool held = r[q] >= 0 && (bm[rr >> 5] >> (rr & 31)) & 1u;
        out[e] = held ? packed[rank_of(bm, pre, rr)] : -1;
    }
}

extern "C" __global__ void __launch_bounds__(NT, NT == 1024 ? 1 : 2)
hits_index(const i64* __restrict__ index, const i64* __restrict__ sel, i64* __restrict__ locs,
           int N) {
    const i64 b = blockIdx.x;
    const i64* ix = index + b * N;
    i64 r[EPT], h[EPT];
#pragma unroll
    for (int q = 0; q < EPT; ++q) {
        const int e = threadIdx.x + q * NT;
        r[q] = e < NSEL ? sel[b * NSEL + e] : -1;
    }
#pragma unroll
    for (int q = 0; q < EPT; ++q) h[q] = r[q] >= 0 ? ix[r[q]] : -1;
#pragma unroll
    for (int q = 0; q < EPT; ++q) {
        const int e = threadIdx.x + q * NT;
        if (e < NSEL) locs[b * NSEL + e] = h[q] >= 0 ? h[q] >> HOT_SLOT_BITS : -1;
    }
}

extern "C" __global__ void __launch_bounds__(NT, NT == 1024 ? 1 : 2)
hits_fly(const i64* __restrict__ hot_rows, const i64* __restrict__ hot_locs,
         const i64* __restrict__ sel, i64* __restrict__ locs) {
    SHARED_LAYOUT
    i64 hr[SPT], hl[SPT], r[EPT];
#pragma unroll
    for (int q = 0; q < SPT; ++q) {
        const int s = threadIdx.x + q * NT;
        hr[q] = s < NSLOT ? hot_rows[b * NSLOT + s] : -1;
        hl[q] = s < NSLOT ? hot_locs[b * NSLOT + s] : 0;
    }
#pragma unroll
    for (int q = 0; q < EPT; ++q) {
        const int e = threadIdx.x + q * NT;
        r[q] = e < NSEL ? sel[b * NSEL + e] : -1;
    }
    for (int w = threadIdx.x; w < NWORD; w += NT) bm[w] = 0u;
    __syncthreads();
#pragma unroll
    for (int q = 0; q < SPT; ++q)
        if (hr[q] >= 0) atomicOr(&bm[hr[q] >> 5], 1u << (hr[q] & 31));
    __syncthreads();
    bit_prefix(bm, pre, tmp);
    __syncthreads();
#pragma unroll
    for (int q = 0; q < SPT; ++q)
        if (hr[q] >= 0) packed[rank_of(bm, pre, (unsigned)hr[q])] = hl[q];
    __syncthreads();
    emit_hits(bm, pre, packed, r, locs + b * NSEL);
}

extern "C" __global__ void __launch_bounds__(NT, NT == 1024 ? 1 : 2)
hits_bits(const unsigned* __restrict__ bits, const i64* __restrict__ ranked,
          const i64* __restrict__ sel, i64* __restrict__ locs) {
    SHARED_LAYOUT
    i64 rk[SPT], r[EPT];
    unsigned wd[WPT];
#pragma unroll
    for (int q = 0; q < SPT; ++q) {
        const int s = threadIdx.x + q * NT;
        rk[q] = s < NSLOT ? ranked[b * NSLOT + s] : 0;
    }
#pragma unroll
    for (int j = 0; j < WPT; ++j) {
        const int w = threadIdx.x + j * NT;
        wd[j] = w < NWORD ? bits[b * NWORD + w] : 0u;
    }
#pragma unroll
    for (int q = 0; q < EPT; ++q) {
        const int e = threadIdx.x + q * NT;
        r[q] = e < NSEL ? sel[b * NSEL + e] : -1;
    }
#pragma unroll
    for (int q = 0; q < SPT; ++q)
        if (threadIdx.x + q * NT < NSLOT) packed[threadIdx.x + q * NT] = rk[q];
#pragma unroll
    for (int j = 0; j < WPT; ++j)
        if (threadIdx.x + j * NT < NWORD) bm[threadIdx.x + j * NT] = wd[j];
    __syncthreads();
    bit_prefix(bm, pre, tmp);
    __syncthreads();
    emit_hits(bm, pre, packed, r, locs + b * NSEL);
}
"""


def run(P: int, nt: int, reps: int, dev: torch.device, flush: Flusher, rows: int = 100_000,
        B: int = 4096, k: int = 2048) -> dict[str, float]:
    import cupy
    import numpy as np

    from kernels._loader import launch, ptr

    words = (rows + 31) // 32
    opts = ("-std=c++17", f"-DNT={nt}", f"-DNWORD={words}", f"-DNSLOT={B}", f"-DNSEL={k}")
    mod = cupy.RawModule(code=SRC, options=opts)
    gen = torch.Generator(device=dev).manual_seed(P)
    # slot s holds row held[:, s]
    held = torch.rand(P, rows, generator=gen, device=dev).argsort(1)[:, :B].contiguous()
    hot_locs = torch.randint(0, 1 << 40, (P, B), generator=gen, device=dev)
    pick = torch.rand(P, B, generator=gen, device=dev).argsort(1)[:, :k]
    sel = held.gather(1, pick).contiguous()
    slot = torch.arange(B, device=dev).expand(P, B)
    index = torch.full((P, rows), -1, dtype=torch.int64, device=dev)
    index.scatter_(1, held, (hot_locs << 20) | slot)
    order = held.sort(1)
    ranked = hot_locs.gather(1, order.indices).contiguous()
    bits = torch.zeros(P, words * 32, dtype=torch.int64, device=dev)
    bits.scatter_(1, held, 1)
    weights = (1 << torch.arange(32, device=dev, dtype=torch.int64))
    bits = (bits.view(P, words, 32) * weights).sum(2)
    bits = (bits - ((bits >= 1 << 31).long() << 32)).to(torch.int32).contiguous()
    want = hot_locs.gather(1, pick)
    shared = 8 * B + 8 * words
    fn = mod.get_function
    forms = {
        "index": (fn("hits_index"), lambda o: (ptr(index), ptr(sel), ptr(o), np.int32(rows)), 0),
        "fly": (fn("hits_fly"), lambda o: (ptr(held), ptr(hot_locs), ptr(sel), ptr(o)), shared),
        "bits": (fn("hits_bits"), lambda o: (ptr(bits), ptr(ranked), ptr(sel), ptr(o)), shared),
    }
    res: dict[str, float] = {}
    for name, (fn, args, sh) in forms.items():
        if sh > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = sh
        out = torch.full((P, k), -7, dtype=torch.int64, device=dev)
        launch(fn, (P,), (nt,), args(out), sh)
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"{name} P={P} NT={nt}: wrong locations"
        res[name] = statistics.median(time_gpu(
            lambda i, fn=fn, a=args(out), sh=sh: launch(fn, (P,), (nt,), a, sh), reps, 3,
            flush=flush))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    dev = torch.device("cuda")
    flush = Flusher(dev)
    rec = {"environment": environment(), "unit": "us (median, L2 flushed)", "cases": []}
    for nt in (1024, 512):
        for P in (1, 32, 132, 160, 264):
            r = run(P, nt, a.reps, dev, flush)
            rec["cases"].append({"requests": P, "threads": nt, **r})
            print(f"P={P:4d} NT={nt:5d} " + "  ".join(f"{k} {v:6.1f}" for k, v in r.items()),
                  flush=True)
    write_json(a.out, rec)


if __name__ == "__main__":
    main()
