#ifndef DHISPARSE_RESOLVER_COPY_CUH
#define DHISPARSE_RESOLVER_COPY_CUH
// The commit's miss copies (resolver_commit.cu): the flattened copy items, the copy blocks'
// share of them (copy_share), the copy loop of 16-, 8- or 4-byte loads (copy_misses), the
// same by the tensor memory accelerator (copy_rows_tma), and the preload of the sync-free
// path.
#include "resolver_common.cuh"
#include "resolver_tma.cuh"

// The TMA copies are functions of their own (not inlined): their code stays off the commit's
// path in calls that copy nothing (a no-miss call with the TMA kernel as built then, its
// preload by TMA in: +0.9-1.6 us against the plain kernel, +1.4-2.1 inlined; H200, eff1103,
// bench/resolver/tma_cost.py; without that preload, the default since 8136b3c, -0.0 to
// +0.2 us, run 70). Diagnostic
// builds: RESOLVER_TMA_INLINE inlines them; RESOLVER_COPY_NOINLINE puts the copies by loads
// out of line (no-miss calls 0.7-0.8 us faster, but the copies 3-10% slower).
#ifdef RESOLVER_TMA_INLINE
#define TMA_CALL __forceinline__
#else
#define TMA_CALL __noinline__
#endif
#ifdef RESOLVER_COPY_NOINLINE
#define COPY_CALL __noinline__
#else
#define COPY_CALL
#endif

// Copy item -> (request, miss index) by binary search over copy offsets in shared memory.
__device__ __forceinline__ int find_request(const i64* off, int batch, i64 c) {
    int lo = 0, hi = batch;  // off[lo] <= c < off[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (off[mid] <= c) lo = mid; else hi = mid;
    }
    return lo;
}

// Copy item `it` of the flattened (layer, request, miss, vector) list: its layer, request b,
// miss index i and vector.
template <typename I>
__device__ __forceinline__ void item_of(I it, I per_layer, I vpr, int n_layers, int batch, const i64* s_off,
                                        int& layer, int& b, i64& i, unsigned& vec) {
    layer = n_layers == 1 ? 0 : (int)(it / per_layer);
    const I li = it - (I)layer * per_layer;
    const I c = li / vpr;
    vec = (unsigned)(li - c * vpr);
    b = find_request(s_off, batch, c);
    i = c - s_off[b];
}

// Its host source. misses through L2: the preload reads them while the lookup grid that
// wrote them still runs.
template <int W>
__device__ __forceinline__ const char* item_src(int layer, int b, i64 i, unsigned vec, int batch, int Kk,
                                                unsigned row_bytes, const i64* misses, const i64* host_ptrs) {
    const i64 r = __ldcg(misses + (i64)b * Kk + i);
    return reinterpret_cast<const char*>(host_ptrs[(i64)layer * batch + b]) + r * row_bytes + (i64)vec * W;
}

// Its destination row in the payload of `layer`: the victim slot's pool row, or the request's
// next staging row.
__device__ __forceinline__ char* item_dst_row(int layer, int b, i64 i, int B, unsigned row_bytes,
                                              const i64* table, const i32* victims, const i64* summary,
                                              const i64* stage_locs, const i64* payload_ptrs, const i64* s_soff) {
    const i64 nv = summary[(i64)b * SCOLS + S_NV];
    const i64 dst = i < nv ? reinterpret_cast<const i64*>(table[(i64)b * TCOLS + T_HOT_LOCS])[victims[(i64)b * B + i]]
                           : stage_locs[s_soff[b] + i - nv];
    return reinterpret_cast<char*>(payload_ptrs[layer]) + dst * row_bytes;
}

// Item index math in I: unsigned (32-bit divisions) when every item index fits, else i64.
// With have_pre, the first round's loads were issued before the lookup grid ended (preload)
// and their values are in pre.
template <int W, typename I>
__device__ COPY_CALL void copy_misses(const i64* __restrict__ table, const i64* __restrict__ misses,
                                      const i32* __restrict__ victims, const i64* __restrict__ summary,
                                      const i64* __restrict__ stage_locs, const i64* __restrict__ host_ptrs,
                                      const i64* __restrict__ payload_ptrs, int n_layers, int batch, int Kk, int B,
                                      unsigned row_bytes, const i64* s_off, const i64* s_soff, i64 n_copies,
                                      int cblock, int ncblocks, const typename Vec<W>::T (&pre)[U], bool have_pre) {
    using V = typename Vec<W>::T;
    const I vpr = (I)(row_bytes / W);
    const I per_layer = (I)n_copies * vpr, total = per_layer * (I)n_layers;
    const I stride = (I)ncblocks * blockDim.x;

    bool first = have_pre;
    for (I base = (I)cblock * blockDim.x + threadIdx.x; base < total; base += stride * U) {
        V v[U];
        char* d[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const I it = base + u * stride;
            if (it < total) {
                int layer, b;
                i64 i;
                unsigned vec;
                item_of<I>(it, per_layer, vpr, n_layers, batch, s_off, layer, b, i, vec);
                // the source even in the preloaded round: a load under `first` cost 1152 B
                // rows 13-24% at 20% misses, batch 32 / 160 (H200, 9d1c1f2 against de0606e
                // in one call: 383.5-398.3 / 2084.7-2122.3 us against 338.5-346.7 /
                // 1693.9-1742.6; 656 B rows unchanged)
                const char* src = item_src<W>(layer, b, i, vec, batch, Kk, row_bytes, misses, host_ptrs);
                const i64 nv = summary[(i64)b * SCOLS + S_NV];
                const i64 dst = i < nv ? reinterpret_cast<const i64*>(table[(i64)b * TCOLS + T_HOT_LOCS])
                                                 [victims[(i64)b * B + i]]
                                           : stage_locs[s_soff[b] + i - nv];
                v[u] = first ? pre[u] : *reinterpret_cast<const V*>(src);
                d[u] = reinterpret_cast<char*>(payload_ptrs[layer]) + dst * row_bytes + (i64)vec * W;
            }
        }
        first = false;
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (base + u * stride < total) *reinterpret_cast<V*>(d[u]) = v[u];
    }
}

// copy_misses with 64-bit item indices (2^32 items or more: rare), a function of its own:
// calls without misses 0.5 / 0.2 / 0.1 us faster at batch 1 / 32 / 160 than with it
// inlined, copies no slower (H200, b8778d7, bench/resolver/tma_cost.py, run 64). The
// diagnostic build RESOLVER_WIDE_INLINE inlines it.
template <int W>
#ifdef RESOLVER_WIDE_INLINE
__device__ __forceinline__
#else
__device__ __noinline__
#endif
void copy_misses_wide(const i64* __restrict__ table, const i64* __restrict__ misses,
                      const i32* __restrict__ victims, const i64* __restrict__ summary,
                      const i64* __restrict__ stage_locs, const i64* __restrict__ host_ptrs,
                      const i64* __restrict__ payload_ptrs, int n_layers, int batch, int Kk, int B,
                      unsigned row_bytes, const i64* s_off, const i64* s_soff, i64 n_copies, int cblock,
                      int ncblocks, const typename Vec<W>::T (&pre)[U], bool have_pre) {
    copy_misses<W, i64>(table, misses, victims, summary, stage_locs, host_ptrs, payload_ptrs, n_layers, batch, Kk,
                        B, row_bytes, s_off, s_soff, n_copies, cblock, ncblocks, pre, have_pre);
}

// Miss copies by the tensor memory accelerator (resolver_tma.cuh; W = 16): row j of the
// flattened (layer, request, miss) list -- ascending host address within a request -- goes
// to TMA warp j % G of the working copy blocks (G = ncblocks * TMA_WARPS; warp g = cblock *
// TMA_WARPS + the warp), whose lane 0 keeps rows in flight in its TMA_STAGES shared buffers
// (bufs: TMA_ROWS rows, bars: TMA_ROWS mbarriers): host -> shared -> device, whole rows. A
// warp's k-th row takes buffer and barrier k % TMA_STAGES (phase k / TMA_STAGES). The first
// TMA_STAGES rows go out at once (start); from then on the row TMA_DEPTH ahead of each one
// stored, so the rows in flight settle at TMA_DEPTH a warp (the preload, while the lookup
// still chooses victims, sends as much as the buffers hold). The rows' addresses
// (a chain of dependent loads each: misses, victims, hot_locs) are worked out 32 at a time,
// one per lane, and handed to lane 0 by shuffles: worked out by lane 0 alone, row after row,
// they held 1152 B rows at 20% misses, batch 160, to 39.5 GB/s against 47.5 by 16-byte loads
// (H200, 1938868). Every lane of the warp calls start() and copy_rows_tma. With preloaded,
// the preload initialized the barriers and issued each warp's first TMA_STAGES rows.
// Calls with fewer than tma_min_rows rows (over every layer; a kernel argument, see
// kernels/resolver_settings.py copy_tma) copy by loads (copy_misses): with ~410 rows the TMA
// warps' few rows each cost a 1152 B row call at batch 1 37 us against 34 (H200, cf41c5a).
struct TmaCopy {
    const i64* misses;
    const i64* host_ptrs;
    int n_layers, batch, Kk;
    unsigned row_bytes;
    const i64* s_off;
    i64 n_copies, G, g;
    unsigned char* buf;
    unsigned long long* bar;

    __device__ i64 mine() const {
        const i64 rows = n_copies * n_layers;
        return g < rows ? (rows - g + G - 1) / G : 0;
    }
    __device__ void row(i64 k, int& layer, int& b, i64& i) const {
        unsigned vec;
        item_of<i64>(g + k * G, n_copies, 1, n_layers, batch, s_off, layer, b, i, vec);
    }
    // host address of the warp's row k, or 0 past its last
    __device__ unsigned long long src(i64 k, i64 n) const {
        if (k >= n) return 0ull;
        int layer, b;
        i64 i;
        row(k, layer, b, i);
        return reinterpret_cast<unsigned long long>(item_src<16>(layer, b, i, 0, batch, Kk, row_bytes, misses,
                                                                 host_ptrs));
    }
    __device__ void load(i64 k, unsigned long long from) const {
        const int s = (int)(k % TMA_STAGES);
        bulk_load(buf + (size_t)s * row_bytes, reinterpret_cast<const void*>(from), row_bytes, bar + s);
    }
    // rows start() sends: as many as the buffers hold
    __device__ i64 first() const { return min(mine(), (i64)TMA_STAGES); }
    // barriers, then the first rows (lane 0); returns how many went out
    __device__ int start() const {
        const int lane = threadIdx.x & 31;
        const i64 n = first();
        const unsigned long long from = src(lane, n);
        if (lane == 0) {
            for (int s = 0; s < TMA_STAGES; ++s) mbar_init(bar + s);
            mbar_init_fence();
        }
#pragma unroll
        for (int k = 0; k < TMA_STAGES; ++k) {
            const unsigned long long f = __shfl_sync(0xffffffffu, from, k);
            if (lane == 0 && k < n) load(k, f);
        }
        return (int)n;
    }
};

__device__ __forceinline__ TmaCopy tma_copy(const i64* misses, const i64* host_ptrs, int n_layers, int batch, int Kk,
                                            unsigned row_bytes, const i64* s_off, i64 n_copies, int cblock,
                                            int ncblocks, unsigned char* bufs, unsigned long long* bars) {
    const int warp = threadIdx.x >> 5;
    return TmaCopy{misses, host_ptrs, n_layers, batch, Kk, row_bytes, s_off, n_copies,
                   (i64)ncblocks * TMA_WARPS, (i64)cblock * TMA_WARPS + warp,
                   bufs + (size_t)warp * TMA_STAGES * row_bytes, bars + warp * TMA_STAGES};
}

__device__ TMA_CALL void copy_rows_tma(const TmaCopy& t, bool preloaded, int B, const i64* __restrict__ table,
                                       const i32* __restrict__ victims, const i64* __restrict__ summary,
                                       const i64* __restrict__ stage_locs, const i64* __restrict__ payload_ptrs,
                                       const i64* s_soff) {
    if ((threadIdx.x >> 5) >= TMA_WARPS) return;  // whole warps
    const int lane = threadIdx.x & 31;
    if (!preloaded) t.start();
    const i64 mine = t.mine(), sent = t.first();
    for (i64 k0 = 0; k0 < mine; k0 += 32) {  // warp-uniform
        // this lane's share: where row k0 + lane goes, where row k0 + lane + TMA_DEPTH comes from
        unsigned long long to = 0;
        if (k0 + lane < mine) {
            int layer, b;
            i64 i;
            t.row(k0 + lane, layer, b, i);
            to = reinterpret_cast<unsigned long long>(
                item_dst_row(layer, b, i, B, t.row_bytes, table, victims, summary, stage_locs, payload_ptrs, s_soff));
        }
        const unsigned long long from = t.src(k0 + lane + TMA_DEPTH, mine);
        const int n = (int)min((i64)32, mine - k0);
        for (int j = 0; j < n; ++j) {
            const unsigned long long d = __shfl_sync(0xffffffffu, to, j), f = __shfl_sync(0xffffffffu, from, j);
            if (lane == 0) {
                const i64 k = k0 + j, next = k + TMA_DEPTH;
                const int s = (int)(k % TMA_STAGES);
                mbar_wait(t.bar + s, (unsigned)(k / TMA_STAGES) & 1u);
                bulk_store(reinterpret_cast<void*>(d), t.buf + (size_t)s * t.row_bytes, t.row_bytes);
                if (next >= sent && next < mine) {  // its buffer's last row (next - TMA_STAGES) is stored
                    bulk_stores_read();  // ... and read out before the next row lands there
                    t.load(next, f);
                }
            }
            __syncwarp();
        }
    }
    if (lane == 0) bulk_stores_done();
}

// Whether a call copying `rows` rows (over every layer) copies them by TMA: in the TMA
// kernel (tma), from tma_min_rows rows on, unless it has few misses (copy_few). The preload
// and the copy path ask alike: a block that preloaded by TMA copies by TMA.
__device__ __forceinline__ bool rows_by_tma(bool tma, i64 rows, int tma_min_rows, bool few) {
    return tma && !few && rows >= tma_min_rows;
}

// A refused call after the preload: the rows in flight land before the block leaves.
__device__ __forceinline__ void tma_drain(unsigned long long* bars, int issued) {
    for (int s = 0; s < issued; ++s) mbar_wait(bars + (threadIdx.x >> 5) * TMA_STAGES + s, 0u);
}

#define COPY_BLOCKS_MIN 16
#define HM_SLOTS 8  // hit-mask slots per commit thread loaded with the summary
#define COPY_ITEMS_PER_BLOCK 512  // W-byte items of the mean request per copy block at work
#define COPY_SPARSE_ROWS 1024  // a batch missing at most this many rows per request: COPY_BLOCKS_MIN
#define PRELOAD_WAIT_NS 2000000  // a preload gives up after this long without every count
#define COPY_FEW_ROWS 16384  // a sparse call missing at most this many rows (one layer) ...
#ifndef COPY_BLOCKS_FEW  // (a diagnostic build may set it)
#define COPY_BLOCKS_FEW 48  // ... has this many blocks at work, copying by 16-byte loads
#endif

// Whether a call of n_copies misses (one layer) has few (copy_share): the rule's sparse case
// (copy_blocks 0) with at most COPY_FEW_ROWS. Its COPY_BLOCKS_FEW blocks copy by loads, all
// of them preloading. H200, tma_cost, 4 rounds of 6, 20% misses, against the rule before
// (COPY_BLOCKS_MIN blocks, by TMA for 1152 B rows from 8192): 1152 B rows at batch 1 / 8 /
// 32 30.4-31.2 / 95.7-96.8 / 319.0-320.7 us on 32 blocks against 35.3-37.5 / 101.2-102.0 /
// 326.9-328.4, 656 B at batch 32 247.9-257.3 against 255.4-266.2 (e94da73); on 48 blocks
// 1152 B at batch 32 315.7-317.5 against 317.3-321.6 on 32 (4262cb8). With many rows more
// blocks lost (batch 160 at 656 B, 32 blocks by loads: +45 to +126 us, 11d30fb; only 16 of
// the 32 preloaded in that build, all of them would now). The limit counts one layer's
// misses: calls copying several layers are not measured. Not where TMA copies were asked
// for from 0 rows (tma_forced: DHISPARSE_COPY_TMA=1). The diagnostic build
// RESOLVER_COPY_FEW_OFF has none (the rule before, SASS and all).
__device__ __forceinline__ bool copy_few(i64 n_copies, int batch, int copy_blocks, bool tma_forced) {
#ifdef RESOLVER_COPY_FEW_OFF
    return false;
#else
    return !tma_forced && copy_blocks <= 0 && n_copies <= (i64)COPY_SPARSE_ROWS * batch &&
           n_copies <= COPY_FEW_ROWS;
#endif
}
#ifdef RESOLVER_COPY_FEW_OFF
#define COPY_PRELOAD_BLOCKS COPY_BLOCKS_MIN
#else
#define COPY_PRELOAD_BLOCKS (COPY_BLOCKS_FEW > COPY_BLOCKS_MIN ? COPY_BLOCKS_FEW : COPY_BLOCKS_MIN)
#endif

// Copy blocks at work (*active) and the spacing of the working ones among the ncb launched
// (*step), for n_copies misses (vpr W-byte vectors a row).
// At work: copy_blocks, or (0) COPY_BLOCKS_FEW where the call has few misses (copy_few),
// else COPY_BLOCKS_MIN while the mean request
// misses at most COPY_SPARSE_ROWS rows, else about one per COPY_ITEMS_PER_BLOCK W-byte
// items of the mean request's misses in one layer, at least COPY_BLOCKS_MIN (layers
// are copied one after the other, so the requests in flight at once depend on the
// rows per request, not on the layer count). Few misses per request spread over many
// requests read fastest with few rows in flight, while dense requests want every
// block (H200, top_k 2048, 100K-row requests, whole calls by copy blocks, 16 / the
// rule before the sparse case / 264: 410 rows per request, batch 160: 1526 / 1613 /
// 1813 us for 656 B rows, 1632 / 1941 / 2058 for 1152 B; batch 32: 274 / 283 / 287 and
// 332 / 353 / 353; 2048 rows per request, batch 160: 5317 / 4899 / 4788 and 9077 /
// 7609 / 7593; bench/results/copy_blocks_h200_186a8d1.json). The mean decides: a dense
// request batched with light ones also gets COPY_BLOCKS_MIN (not measured).
// The working blocks are spread over the launched ones (every step-th): consecutive
// blocks share SMs, and a commit launched with PDL is placed in index order onto
// whatever the lookup left free; the sparse rule takes the first ones, as a launch of
// exactly that many would (H200, c4dec7e, 20% misses, batch 32 / 160: 273 / 1481 us
// for 656 B rows, 333 / 1667 for 1152 B, against 286 / 1531 and 334 / 1769 with every
// 16th at work, runs 32 and 31)
__device__ __forceinline__ void copy_share(i64 n_copies, int batch, int copy_blocks, bool few, int ncb,
                                           unsigned vpr, int* active, int* step) {
    int a = copy_blocks;
    const bool sparse = a <= 0 && n_copies <= (i64)COPY_SPARSE_ROWS * batch;
    if (sparse) {
        a = few ? COPY_BLOCKS_FEW : COPY_BLOCKS_MIN;
    } else if (a <= 0) {
        const i64 per_request = (n_copies * vpr + batch - 1) / batch;
        a = (int)min((i64)ncb, max((i64)COPY_BLOCKS_MIN, (per_request + COPY_ITEMS_PER_BLOCK - 1) /
                                                             COPY_ITEMS_PER_BLOCK));
    }
    *active = min(a, ncb);
    *step = sparse ? 1 : ncb / *active;
}

// The preload by TMA: each TMA warp's first rows (lane 0 issues them; *issued: how many).
// Built only with -DRESOLVER_TMA_PRELOAD (DHISPARSE_RESOLVER_TMA_PRELOAD=1): its code alone,
// never run by a call without misses, makes those calls 1.0-1.7 us slower at batch 1 / 32 /
// 160 (the TMA kernel with it against the plain kernel; without it -0.0 / -0.3 / +0.2),
// while its early rows save 1152 B rows at 20% misses ~7 us of ~330 at batch 32 and nothing
// beyond the rounds' spread at batch 160 (H200, bench/resolver/tma_cost.py: run 67 at
// 792ea08 found the cause, run 70 at 4ff26b3 gave these figures). Without it the TMA
// kernel's preload only prefetches its first round of such rows into L2 (below) and
// returns false: the bulk copies go out after the lookup grid ended.
__device__ TMA_CALL void preload_tma(const TmaCopy t, int* issued) {
    if ((threadIdx.x >> 5) < TMA_WARPS) {  // whole warps
        const int n = t.start();
        if (!(threadIdx.x & 31)) *issued = n;
    }
}

// A copy block of the sync-free path before the lookup grid has ended: waits for every
// request's miss count (S_EARLY of this call, published once the request's misses are
// listed), makes the copy offsets (s_off) and, if the block is one at work, issues the
// loads of its first round of items into pre -- the host reads start while the lookup
// blocks still choose victims. Returns whether pre holds them. No store: the destinations
// (victims, staging) and the call's status come after griddepcontrol.wait, and a refused
// call drops the loaded values. Gives up (false) after PRELOAD_WAIT_NS.
// Only the sparse case of the rule preloads (its first COPY_BLOCKS_MIN copy blocks, or
// COPY_BLOCKS_FEW where the call has few misses; COPY_PRELOAD_BLOCKS of them poll): with
// dense misses every working block's first round is the whole copy or near it, and reading
// it while the lookup ran cost time (H200, db6c063, cold batch 1, 656 / 1152 B: 53.8 /
// 71.4 us against 51.3 / 69.3 without; 20% misses, batch 1: 35.3 / 36.7 against 40.3 /
// 44.4, batch 32: 277.2 / 337.2 against 284.1 / 340.5). The other blocks do not poll, so
// neither does the last one (the batch's totals, on every call's path) where more than
// COPY_PRELOAD_BLOCKS copy blocks are launched (launched_copy_blocks: at least 3/4 of the SM
// count).
template <int W>
__device__ bool preload(typename Vec<W>::T (&pre)[U], const i64* __restrict__ summary,
                        const i64* __restrict__ misses, const i64* __restrict__ host_ptrs, int n_layers,
                        int batch, int Kk, unsigned row_bytes, int copy_blocks, int ncb, int cb, int call,
                        i64* preloads, i64* s_off, unsigned* s_tmp, int* s_flag, bool tma,
                        int tma_min_rows, unsigned char* bufs, unsigned long long* bars, int* tma_issued) {
    using V = typename Vec<W>::T;
    if (copy_blocks > 0 || cb >= COPY_PRELOAD_BLOCKS) return false;  // block-uniform
    unsigned long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    if (threadIdx.x == 0) *s_flag = 1;
    __syncthreads();
    unsigned mv[2] = {0u, 0u};
    bool ok = true;
#pragma unroll
    for (int j = 0; j < 2; ++j) {  // requests 2 t, 2 t + 1 (blockDim.x >= MAXB / 2)
        const int q = 2 * threadIdx.x + j;
        if (q >= batch) continue;
        const i64* at = summary + (i64)q * SCOLS + S_EARLY;
        i64 v = ld_acquire(at);
        while ((v >> 32) != (i64)call && ok) {
            __nanosleep(100);
            unsigned long long t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            ok = t - t0 < PRELOAD_WAIT_NS;
            v = ld_acquire(at);
        }
        mv[j] = (unsigned)(v & 0xFFFFFFFFll);
    }
    if (!ok) *s_flag = 0;
    unsigned total;
    unsigned o = block_scan(mv[0] + mv[1], s_tmp, &total);  // syncs (s_flag is final)
    if (!*s_flag) return false;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int q = 2 * threadIdx.x + j;
        if (q < batch) s_off[q] = o, o += mv[j];
    }
    if (total == 0 || total > (unsigned)COPY_SPARSE_ROWS * batch) return false;  // block-uniform
    if (threadIdx.x == 0) s_off[batch] = total;
    __syncthreads();
    const unsigned vpr = row_bytes / W;
    int active, step;
    const bool few = copy_few(total, batch, copy_blocks, tma && tma_min_rows == 0);
    copy_share(total, batch, copy_blocks, few, ncb, vpr, &active, &step);
    if (cb % step != 0 || cb / step >= active) return false;
    const bool tma_rows = rows_by_tma(tma, (i64)total * n_layers, tma_min_rows, few);
#ifdef RESOLVER_TMA_PRELOAD  // opt-in build (DHISPARSE_RESOLVER_TMA_PRELOAD=1): each TMA warp's first rows
    if (tma_rows) {
        preload_tma(tma_copy(misses, host_ptrs, n_layers, batch, Kk, row_bytes, s_off, (i64)total, cb / step,
                             active, bufs, bars),
                    tma_issued);
        if (threadIdx.x == 0) atomicAdd(reinterpret_cast<unsigned long long*>(preloads), 1ull);
        return true;
    }
#endif
#ifdef RESOLVER_NO_TMA_WARM  // diagnostic build: not even L2 warmed (below)
    if (tma_rows) return false;
#endif
    const i64 per_layer = (i64)total * vpr, items = per_layer * n_layers, stride = (i64)active * blockDim.x;
    const i64 base = (i64)(cb / step) * blockDim.x + threadIdx.x;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const i64 it = base + u * stride;
        if (it < items) {
            int layer, b;
            i64 i;
            unsigned vec;
            item_of<i64>(it, per_layer, (i64)vpr, n_layers, batch, s_off, layer, b, i, vec);
            const char* src = item_src<W>(layer, b, i, vec, batch, Kk, row_bytes, misses, host_ptrs);
            // rows that go by TMA are only prefetched into L2 (which caches host reads), for
            // the bulk copies after the lookup: 1152 B rows at 20% misses, batch 32, 330.6-330.8
            // us against 332.0-333.4 without, no cost without misses (H200, 860df13, run 72)
            if (tma_rows) {
                asm volatile("prefetch.global.L2 [%0];" ::"l"(src));
                continue;
            }
            pre[u] = *reinterpret_cast<const V*>(src);
        }
    }
    if (tma_rows) return false;  // nothing in pre
    if (threadIdx.x == 0) atomicAdd(reinterpret_cast<unsigned long long*>(preloads), 1ull);
    return true;
}

#endif
