// Launch 2 of the fused resolver (see resolver_common.cuh): commit blocks and miss
// copies (resolver_copy.cuh); plus the plan copies of follower payload layers.
#include "resolver_common.cuh"
#include "resolver_copy.cuh"

// The commit's copy offsets (exclusive, [0, batch]) in shared memory: of the copies and of
// the staging rows. At namespace scope since 14ec96c: declared inside commit_body, they make
// the commit kernels compile to other SASS than the one the GPU tests and runs 69-72 ran.
__shared__ i64 c_off[MAXB + 1], c_soff[MAXB + 1];
#ifdef RESOLVER_DIAG_SMID
#define DIAG_SMID_MAX 1024
__device__ int diag_smid[DIAG_SMID_MAX];  // read and reset by bench/resolver/tma_cost.py
#endif

// The block's role: commit block x < n_commit, else copy block x - n_commit. The copy
// blocks come first in the grid: blocks start in index order, so they are the ones that
// start beside a lookup still running (with the 2x512 lookup at batch 160, on the 52 SMs it
// leaves free) and their preload goes out before it ends. With the commit blocks first (the
// diagnostic build RESOLVER_COMMIT_FIRST, the order until run 104) 2x512 slowed batch-160
// calls with misses; with the copy blocks first it speeds them up (H200, 3c79a3b, 656 B,
// 20% misses: 1360.4 / 1361.8 us against 1446.3 / 1426.8 with the 1024-thread lookup).
__device__ __forceinline__ int block_role(int n_commit) {
#ifdef RESOLVER_COMMIT_FIRST
    return (int)blockIdx.x;
#else
    const int ncb = (int)gridDim.x - n_commit;
    return (int)blockIdx.x < ncb ? n_commit + (int)blockIdx.x : (int)blockIdx.x - ncb;
#endif
}

// A copy block of the commit launch once the lookup grid ended, in a call with copies: its
// share of the miss copies (copy_share), by loads or, in the TMA kernel from tma_min_rows
// rows on, by the tensor memory accelerator. Out of line it made 20%-miss calls slower
// (batch 160: +162 us; H200, 14ec96c, run 66).
template <int W, bool TMA>
__device__ __forceinline__ void copy_block(const i64* __restrict__ table, const i64* __restrict__ misses,
                                          const i32* __restrict__ victims, const i64* __restrict__ summary,
                                          const i64* __restrict__ totals, const i64* __restrict__ stage_locs,
                                          const i64* __restrict__ host_ptrs, const i64* __restrict__ payload_ptrs,
                                          int n_layers, int batch, int Kk, int B, unsigned row_bytes,
                                          int copy_blocks, int sums_here, int n_commit, i64 n_copies,
                                          int tma_min_rows, const typename Vec<W>::T (&pre)[U], bool have_pre,
                                          unsigned char* s_rows, unsigned long long* s_bar) {
    constexpr bool tma = W == 16 && TMA;
    const i64* copy_off = totals + TOT_COLS;
    const i64* stage_off = copy_off + batch + 1;
    const int ncb = gridDim.x - n_commit;
    int active, step;
    const bool few = copy_few(n_copies, batch, copy_blocks, tma && tma_min_rows == 0);
    copy_share(n_copies, batch, copy_blocks, few, ncb, row_bytes / W, &active, &step);
    const int cb = block_role(n_commit) - n_commit;
    if (cb % step != 0 || cb / step >= active) return;
#ifdef RESOLVER_DIAG_SMID  // diagnostic build: the SM of each copy block at work, by its share
    if (threadIdx.x == 0 && cb / step < DIAG_SMID_MAX) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        diag_smid[cb / step] = (int)smid;
    }
#endif
    if (!sums_here) {
        for (int i = threadIdx.x; i <= batch; i += blockDim.x) {
            c_off[i] = copy_off[i];
            c_soff[i] = stage_off[i];
        }
        __syncthreads();
    }
    // 32-bit item indices when the last one (plus a stride of U rounds) stays below 2^32
    const i64 items = n_copies * (row_bytes / W) * n_layers + (i64)active * blockDim.x * U;
    if (rows_by_tma(tma, n_copies * n_layers, tma_min_rows, few))  // else by loads
        copy_rows_tma(tma_copy(misses, host_ptrs, n_layers, batch, Kk, row_bytes, c_off, n_copies, cb / step,
                               active, s_rows, s_bar),
                      have_pre, B, table, victims, summary, stage_locs, payload_ptrs, c_soff);
    else if (items < (1ll << 32))
        copy_misses<W, unsigned>(table, misses, victims, summary, stage_locs, host_ptrs, payload_ptrs, n_layers,
                                 batch, Kk, B, row_bytes, c_off, c_soff, n_copies, cb / step, active, pre,
                                 have_pre);
    else
        copy_misses_wide<W>(table, misses, victims, summary, stage_locs, host_ptrs, payload_ptrs, n_layers,
                            batch, Kk, B, row_bytes, c_off, c_soff, n_copies, cb / step, active, pre,
                            have_pre);
}

// grid: [0, batch * parts) commit blocks, [batch * parts, gridDim.x) copy blocks (n_layers
// may be 0). Commit block x serves request x % batch, part x / batch: part p stamps the hits
// of slots [p R, (p + 1) R) (R = B / parts rounded up to whole mask words), part 0 also
// takes the misses (victims, staging, copy list, locations). More parts spread a request's
// stamping stores over more SMs.
template <int W, bool TMA>
__device__ void commit_body(const i64* __restrict__ table, const i64* __restrict__ sel,
                            i64* __restrict__ locs, i64* __restrict__ miss_dst,
                            const i64* __restrict__ misses, const i32* __restrict__ victims,
                            const i32* __restrict__ hit_mask, const i64* __restrict__ summary,
                            i64* __restrict__ totals, const i64* __restrict__ stage_locs,
                            i64 n_stage_locs, i64* __restrict__ copy_batch, i64* __restrict__ copy_rows,
                            i64* __restrict__ copy_dst, i64* __restrict__ staged_rows,
                            const i64* __restrict__ host_ptrs, const i64* __restrict__ payload_ptrs,
                            int n_layers, int batch, int K, int k, int B, unsigned row_bytes, i64 epoch,
                            int copy_blocks, int sums_here, int parts, int parity, int call,
                            int tma_min_rows) {
    __shared__ __align__(8) unsigned long long s_bar[TMA ? TMA_ROWS : 1];
    extern __shared__ __align__(128) unsigned char s_rows[];  // TMA: TMA_ROWS rows
    constexpr bool tma = W == 16 && TMA;
    int tma_issued = 0;  // rows the preload sent to this thread's TMA stages
    __shared__ int s_ok, s_fast, s_pre;
    __shared__ unsigned s_tmp[33], s_cnt[8];
    const int Kk = K * k;
    const int n_commit = batch * parts;
    const int bi = block_role(n_commit);
    // copy blocks of the sync-free path (call != 0): the first round of host reads goes out
    // before the lookup grid ends (preload)
    typename Vec<W>::T pre[U];
    bool have_pre = false;
    if (call && sums_here && n_layers > 0 && bi >= n_commit)
        have_pre = preload<W>(pre, summary, misses, host_ptrs, n_layers, batch, Kk, row_bytes, copy_blocks,
                              (int)gridDim.x - n_commit, bi - n_commit, call, totals + R_PRELOADS,
                              c_off, s_tmp, &s_pre, tma, tma_min_rows, s_rows, s_bar, &tma_issued);
    // launched right behind the lookup with programmatic stream serialization (PDL): wait
    // here until the lookup grid finished and its writes are visible (a no-op otherwise)
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    TRACE_AT(16, bi);
    const i64* copy_off = totals + TOT_COLS;
    const i64* stage_off = copy_off + batch + 1;
    // a commit block loads its summary, its slot-state pointers and the hit-mask words of its
    // first HM_SLOTS * blockDim.x slots together with the totals (one round trip, not three:
    // for B up to that, the stamping below waits for no further load)
    const bool commit_block = bi < n_commit;
    const int rb = commit_block ? bi % batch : 0, part = commit_block ? bi / batch : 0;
    const int span = ((B + parts - 1) / parts + 31) & ~31, s_lo = min(B, part * span), s_hi = min(B, s_lo + span);
    const i64* sm = summary + (i64)rb * SCOLS;
    const i64* row = table + (i64)rb * TCOLS;
    i64 su = 0, m = 0, nv = 0, nhit = 0, off = 0, soff = 0;
    i64 *hot_rows = nullptr, *stamp = nullptr, *hot_index = nullptr;
    const i64* hot_locs = nullptr;
    i64 tail_hi = 0;
    unsigned hw[HM_SLOTS];
    const unsigned* hm = reinterpret_cast<const unsigned*>(hit_mask + (i64)rb * B);
    if (commit_block) {
        su = sm[S_U], m = sm[S_M], nv = sm[S_NV], nhit = sm[S_NHIT];
        hot_rows = ptr<i64>(row, T_HOT_ROWS), stamp = ptr<i64>(row, T_HOT_STAMP);
        hot_locs = ptr<const i64>(row, T_HOT_LOCS);
        hot_index = ptr<i64>(row, T_HOT_INDEX), tail_hi = row[T_TAIL_HI];
        if (!sums_here) off = copy_off[rb], soff = stage_off[rb];
    }
    // the lookups' pending copies | status of this call (R_PEND, parity)
    const i64* pend = totals + R_PEND + 2 * parity;
    const i64 pending = sums_here && threadIdx.x == 0 ? __ldcg(pend + P_COPIES) | __ldcg(pend + P_STATUS) : 0;
#pragma unroll
    for (int q = 0; q < HM_SLOTS; ++q) {
        const int s = s_lo + threadIdx.x + q * blockDim.x;
        hw[q] = commit_block && s < s_hi ? hm[s >> 5] : 0u;
    }
    // when the first loads arrived (run 128: 1.4-2.4 us after the wait for the first, the
    // table's row, which the lookup read; the others right behind it)
    TRACE_DEP_AT(23, bi, tail_hi);
    TRACE_DEP_AT(20, bi, su);
    TRACE_DEP_AT(21, bi, pending);
    TRACE_DEP_AT(22, bi, hw[0]);
    if (sums_here) {
        // nothing pending: no copies, no staging, good input, every offset 0 -- the sums are
        // needed for the totals only, by the last block (every block reading every summary
        // cost 5.6 us at batch 160 in the 1d7540b trace, 2.8 at batch 1)
        if (threadIdx.x == 0) {
            s_fast = pending == 0;
            s_ok = 1, c_off[batch] = 0;  // what the sums give then (sum_batch overwrites them)
        }
        __syncthreads();
        const bool totals_block = bi == (int)gridDim.x - 1;
        if (!s_fast || totals_block) {  // block-uniform
            sum_batch(summary, totals, batch, n_stage_locs, totals_block, c_off, c_soff, &s_ok, s_tmp,
                      s_cnt);  // syncs
            if (commit_block) off = c_off[rb], soff = c_soff[rb];
        }
        if (totals_block && threadIdx.x == 0) {  // the next call's slots (read by no block of this one)
            i64* next = totals + R_PEND + 2 * (parity ^ 1);
            next[P_COPIES] = next[P_STATUS] = 0;
        }
    } else {
        if (threadIdx.x == 0) {
            const i64 staged = totals[R_STAGED];
            s_ok = totals[R_STATUS] == 0 && staged <= n_stage_locs;
            if (!s_ok && bi == 0 && totals[R_STATUS] == 0) totals[R_STATUS] = ST_STAGING;
        }
        __syncthreads();
    }
    TRACE_AT(17, bi);  // totals read
    if (!s_ok) {
        tma_drain(s_bar, tma_issued);
        return;
    }
    if (!commit_block) {
        const i64 n_copies = sums_here ? c_off[batch] : totals[R_COPIES];
        if (n_copies > 0 && n_layers > 0)
            copy_block<W, TMA>(table, misses, victims, summary, totals, stage_locs, host_ptrs, payload_ptrs,
                               n_layers, batch, Kk, B, row_bytes, copy_blocks, sums_here, n_commit, n_copies,
                               tma_min_rows, pre, have_pre, s_rows, s_bar);
        return;
    }
    const int b = rb;
    if (su == 0) return;  // direct lookup: no LRU change
    TRACE_AT(18, bi);  // summary read
    // loads of a group of U items are issued before their stores (see the lookup passes).
    // hot_index: a victim's row leaves it, its miss enters (no other thread's write can
    // meet these: the misses are held by no slot, the evicted rows by one each, I4); rows
    // past tail_hi are not committed and have no index entry (only a state broken by hand
    // holds them)
    for (i64 i0 = part == 0 ? threadIdx.x : m; i0 < m; i0 += blockDim.x * U) {
        i64 r[U], dst[U], old[U];
        int slot[U];
#pragma unroll
        for (int q = 0; q < U; ++q) {
            const i64 i = i0 + q * blockDim.x;
            r[q] = i < m ? misses[(i64)b * Kk + i] : 0;
            slot[q] = i < nv ? victims[(i64)b * B + i] : -1;
        }
#pragma unroll
        for (int q = 0; q < U; ++q) {
            const i64 i = i0 + q * blockDim.x;
            dst[q] = slot[q] >= 0 ? hot_locs[slot[q]] : (i < m ? stage_locs[soff + i - nv] : 0);
            old[q] = slot[q] >= 0 ? hot_rows[slot[q]] : -1;
        }
#pragma unroll
        for (int q = 0; q < U; ++q) {
            const i64 i = i0 + q * blockDim.x;
            if (i >= m) continue;
            if (slot[q] >= 0) {
                if (old[q] >= 0 && old[q] < tail_hi) hot_index[old[q]] = -1;
                hot_index[r[q]] = dst[q] << HOT_SLOT_BITS | slot[q];
                hot_rows[slot[q]] = r[q];
                stamp[slot[q]] = epoch;
            } else {
                staged_rows[soff + i - nv] = r[q];
            }
            miss_dst[(i64)b * Kk + i] = dst[q];
            copy_batch[off + i] = b;
            copy_rows[off + i] = r[q];
            copy_dst[off + i] = dst[q];
        }
    }
    // hot_rows changed: the rank form's cache of the request is stale (resolver_rank.cuh)
    if (part == 0 && threadIdx.x == 0 && nv > 0) ptr<i64>(row, T_HOT_RANK)[RANK_VERSION] += 1;
    // hit slots from the lookup's mask, slot by slot: a warp's stores cover 32 consecutive
    // slots (coalesced; a list of scattered slots cost a sector per store)
    if (nhit > 0) {
#pragma unroll
        for (int q = 0; q < HM_SLOTS; ++q) {
            const int s = s_lo + threadIdx.x + q * blockDim.x;
            if ((hw[q] >> (s & 31)) & 1u) stamp[s] = epoch;  // 0 past s_hi
        }
    }
    const int hm_done = s_lo + HM_SLOTS * blockDim.x;
    for (int s0 = nhit > 0 ? hm_done + threadIdx.x : s_hi; s0 < s_hi; s0 += blockDim.x * U) {
        unsigned w[U];
#pragma unroll
        for (int q = 0; q < U; ++q) w[q] = s0 + q * (int)blockDim.x < s_hi ? hm[(s0 + q * blockDim.x) >> 5] : 0u;
#pragma unroll
        for (int q = 0; q < U; ++q) {
            const int s = s0 + q * blockDim.x;
            if ((w[q] >> (s & 31)) & 1u) stamp[s] = epoch;
        }
    }
    TRACE_AT(19, bi);  // victims / hits stamped
    if (m == 0 || part > 0) return;  // hits only: every location was final after the lookup
    __syncthreads();
    i64* l_b = locs + (i64)b * Kk;
    for (int e0 = threadIdx.x; e0 < Kk; e0 += blockDim.x * U) {
        i64 l[U], d[U];
#pragma unroll
        for (int q = 0; q < U; ++q) l[q] = e0 + q * (int)blockDim.x < Kk ? l_b[e0 + q * blockDim.x] : -1;
#pragma unroll
        for (int q = 0; q < U; ++q) d[q] = l[q] < -1 ? miss_dst[(i64)b * Kk + (-2 - l[q])] : 0;
#pragma unroll
        for (int q = 0; q < U; ++q)
            if (l[q] < -1) l_b[e0 + q * blockDim.x] = d[q];
    }
}

// resolve_commit_<W>: W-byte vector copies; resolve_commit_16_tma: the same kernel with the
// miss copies by the tensor memory accelerator from tma_min_rows rows on (its own registers:
// the copy loop of the others stays as it was; they ignore tma_min_rows)
#define COMMIT(NAME, W, TMA)                                                                                  \
    extern "C" __global__ void __launch_bounds__(512, 2) NAME(                                                 \
        const i64* table, const i64* sel, i64* locs, i64* miss_dst, const i64* misses,    \
        const i32* victims, const i32* hit_mask, const i64* summary, i64* totals,            \
        const i64* stage_locs, i64 n_stage_locs, i64* copy_batch, i64* copy_rows,             \
        i64* copy_dst, i64* staged_rows, const i64* host_ptrs, const i64* payload_ptrs,       \
        int n_layers, int batch, int K, int k, int B, unsigned row_bytes, i64 epoch, int copy_blocks,     \
        int sums_here, int parts, int parity, int call, int tma_min_rows) {                                    \
        commit_body<W, TMA>(table, sel, locs, miss_dst, misses, victims, hit_mask, summary, totals,          \
                            stage_locs, n_stage_locs, copy_batch, copy_rows, copy_dst, staged_rows, host_ptrs, \
                            payload_ptrs, n_layers, batch, K, k, B, row_bytes, epoch, copy_blocks, sums_here, \
                            parts, parity, call, tma_min_rows);                                                \
    }
COMMIT(resolve_commit_16, 16, false)
COMMIT(resolve_commit_8, 8, false)
COMMIT(resolve_commit_4, 4, false)
COMMIT(resolve_commit_16_tma, 16, true)

// apply_copies for one payload layer from a plan's copy list (sorted by (batch, row)):
// payload[copy_dst[c]] = host(batch c)[copy_rows[c]]; n read from *count (device) so the
// follower copies of the sync-free path need no host round trip.
template <int W>
__device__ void plan_copy_body(char* __restrict__ payload, const i64* __restrict__ copy_batch,
                               const i64* __restrict__ copy_rows, const i64* __restrict__ copy_dst,
                               const i64* __restrict__ host_ptrs, const i64* __restrict__ count,
                               i64 n_fixed, unsigned row_bytes) {
    using V = typename Vec<W>::T;
    const unsigned vpr = row_bytes / W;
    const i64 total = (count ? count[0] : n_fixed) * vpr, stride = (i64)gridDim.x * blockDim.x;

    for (i64 base = (i64)blockIdx.x * blockDim.x + threadIdx.x; base < total; base += stride * U) {
        V v[U];
        char* d[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const i64 it = base + u * stride;
            if (it < total) {
                const i64 c = it / vpr;
                const unsigned vec = (unsigned)(it - c * vpr);
                const char* src = reinterpret_cast<const char*>(host_ptrs[copy_batch[c]]);
                v[u] = *reinterpret_cast<const V*>(src + copy_rows[c] * row_bytes + (i64)vec * W);
                d[u] = payload + copy_dst[c] * row_bytes + (i64)vec * W;
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (base + u * stride < total) *reinterpret_cast<V*>(d[u]) = v[u];
    }
}

#define PLAN_COPY(W)                                                                                        \
    extern "C" __global__ void plan_copy_##W(char* payload, const i64* copy_batch, const i64* rows, \
                                             const i64* dst, const i64* host_ptrs,                  \
                                             const i64* count, i64 n_fixed, unsigned row_bytes) {       \
        plan_copy_body<W>(payload, copy_batch, rows, dst, host_ptrs, count, n_fixed, row_bytes);            \
    }
PLAN_COPY(16)
PLAN_COPY(8)
PLAN_COPY(4)
