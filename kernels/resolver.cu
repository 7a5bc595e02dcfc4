// Fused resolver (DESIGN 3.2) over services/decode/hierarchy's layout, in two launches.
//
//   launch 1  resolve_lookup      grid = batch blocks (one per request), 1024 threads
//             direct path (tail, ready optional page), union of the remaining rows as a
//             bitmap over source rows [0, nbits) in shared memory (a set bit = a row some
//             query needs; ranks by word prefix + popcount give the ascending order of
//             the union, eq. 6, for free), hot hits found by scanning the B slots against
//             the bitmap (bounded by B), LRU victims by a bitonic sort of (stamp, slot)
//             keys of the unprotected, non-hit slots. Mutates nothing: writes per-request
//             scratch and a summary row; the last block to finish (atomic ticket) sums the
//             summaries into offsets (copies, staging) and totals.
//   launch 2  resolve_commit      grid = batch commit blocks + copy blocks
//             commit block b: victims take the misses (ascending rows), hit and victim
//             slots get stamp = protect = epoch, staged rows take stage_locs in order,
//             locations are finished in selection order, the plan's copy list is written.
//             copy blocks: the union of every request's misses, flattened into 16-byte
//             items over (layer, request, row, vector) -- i.e. ascending host address
//             within a request -- spread over all copy blocks, read from mapped host
//             memory. Nothing is mutated or copied when status != 0 (bad input, staging
//             arena too small): the host raises with the group unchanged.
// No host synchronization between or inside the launches.

// No std headers: NVRTC (CuPy) compiles this without a host C++ library.
typedef long long i64;
typedef int i32;
typedef unsigned short u16;

#define NT 1024
#define MAXB 1024  // batch limit (shared offsets of the copy blocks)

template <int W> struct Vec;
template <> struct Vec<16> { using T = uint4; };
template <> struct Vec<8> { using T = uint2; };
template <> struct Vec<4> { using T = unsigned int; };
#define SENTINEL (-9223372036854775807LL - 1)

// request table columns (int64 [batch, TCOLS], built by kernels/resolver.py)
enum { T_HOT_ROWS, T_HOT_STAMP, T_HOT_PROTECT, T_HOT_LOCS, T_TAIL_LOCS, T_PAGE_MAP, T_PAGE_READY,
       T_TAIL_LO, T_TAIL_HI, TCOLS };
// summary columns (int64 [batch, SCOLS])
enum { S_STATUS, S_U, S_M, S_NV, S_NHIT, S_TAIL, S_OPT, S_HOT, S_HOST, S_DIRECT, SCOLS };
// totals (int64 [TOT_COLS + 2 * (batch + 1)]): then copy offsets [batch+1], stage offsets [batch+1]
enum { R_STATUS, R_COPIES, R_STAGED, R_TAIL, R_OPT, R_HOT, R_HOST, R_DIRECT, R_TICKET, TOT_COLS };
// status bits
enum { ST_SEL_LT_M1 = 1, ST_VISIBLE = 2, ST_SEL_GE_VISIBLE = 4, ST_NOT_RESIDENT = 8, ST_ROW_RANGE = 16,
       ST_STAGING = 32 };

template <typename T> __device__ __forceinline__ T* ptr(const i64* row, int col) {
    return reinterpret_cast<T*>(row[col]);
}

// Block-wide exclusive scan of one unsigned per thread; returns the exclusive prefix and
// the block total through *total. Uses 33 words of shared memory at `tmp`.
__device__ __forceinline__ unsigned block_scan(unsigned v, unsigned* tmp, unsigned* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        unsigned y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) tmp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        unsigned w = lane < (blockDim.x >> 5) ? tmp[lane] : 0u;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            unsigned y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        tmp[lane] = w;  // inclusive per warp
        if (lane == 31) tmp[32] = w;
    }
    __syncthreads();
    const unsigned excl = (warp ? tmp[warp - 1] : 0u) + x - v;
    *total = tmp[32];
    __syncthreads();
    return excl;
}

// Exclusive prefix (uint16) of popcounts of `bm[0..W)`: thread t owns a contiguous chunk.
__device__ unsigned bitmap_prefix(const unsigned* bm, u16* pre, int W, unsigned* tmp) {
    const int chunk = (W + NT - 1) / NT, lo = threadIdx.x * chunk, hi = min(W, lo + chunk);
    unsigned s = 0;
    for (int w = lo; w < hi; ++w) s += __popc(bm[w]);
    unsigned total;
    unsigned run = block_scan(s, tmp, &total);
    for (int w = lo; w < hi; ++w) {
        pre[w] = (u16)run;
        run += __popc(bm[w]);
    }
    __syncthreads();
    return total;
}

__device__ __forceinline__ unsigned rank_of(const unsigned* bm, const u16* pre, i64 row) {
    const int w = (int)(row >> 5), bit = (int)(row & 31);
    return pre[w] + __popc(bm[w] & ((1u << bit) - 1u));
}

__device__ __forceinline__ bool test_bit(const unsigned* bm, i64 row) {
    return (bm[row >> 5] >> (row & 31)) & 1u;
}

__device__ __forceinline__ void block_add(unsigned long long* dst, unsigned v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0 && v) atomicAdd(dst, (unsigned long long)v);
}

// shared layout of resolve_lookup (dynamic): need bitmap [W] u32, miss bitmap [W] u32,
// need prefix [W] u16, miss prefix [W] u16, then LRU keys [Bp] u64 (8-byte aligned).
extern "C" __global__ void __launch_bounds__(NT) resolve_lookup(
    const i64* __restrict__ table, const i64* __restrict__ sel, const i64* __restrict__ visible,
    i64* __restrict__ locs, i64* __restrict__ need_loc, i64* __restrict__ misses,
    i32* __restrict__ victims, i32* __restrict__ hit_slots, i64* __restrict__ summary,
    i64* __restrict__ totals, int batch, int K, int k, int B, int Bp, int T, int p, int W,
    i64 finished_epoch) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ unsigned tmp[33];
    __shared__ unsigned long long cnt[8];  // tail, opt, hot, host, nhit, ncand, status
    __shared__ int last;
    const int b = blockIdx.x, Kk = K * k;
    const i64* row = table + (i64)b * TCOLS;
    unsigned* need_bm = reinterpret_cast<unsigned*>(smem);
    unsigned* miss_bm = need_bm + W;
    u16* need_pre = reinterpret_cast<u16*>(miss_bm + W);
    u16* miss_pre = need_pre + W;
    unsigned long long* keys =
        reinterpret_cast<unsigned long long*>(smem + ((size_t)(12 * W + 15) / 16) * 16);
    const i64 tail_lo = row[T_TAIL_LO], tail_hi = row[T_TAIL_HI];
    const i64* tail_locs = ptr<const i64>(row, T_TAIL_LOCS);
    const i64* page_map = ptr<const i64>(row, T_PAGE_MAP);
    const bool* page_ready = ptr<const bool>(row, T_PAGE_READY);
    const i64* s_b = sel + (i64)b * Kk;
    i64* l_b = locs + (i64)b * Kk;
    const i64 nbits = (i64)W * 32;

    for (int w = threadIdx.x; w < W; w += NT) need_bm[w] = 0u;
    if (threadIdx.x < 8) cnt[threadIdx.x] = 0ull;
    __syncthreads();

    // pass 1: direct path; the rest becomes the union bitmap
    unsigned n_tail = 0, n_opt = 0, status = 0;
    for (int e = threadIdx.x; e < Kk; e += NT) {
        const i64 r = s_b[e], vis = visible[(i64)b * K + e / k];
        unsigned bad = 0;
        if (vis < 0 || vis > tail_hi) bad |= ST_VISIBLE;
        i64 loc = -1;
        if (r < -1) bad |= ST_SEL_LT_M1;
        if (r >= vis) bad |= ST_SEL_GE_VISIBLE;
        status |= bad;
        if (r >= 0 && !bad) {  // a flagged entry reads no table (it may be out of range)
            if (r >= tail_lo && r < tail_hi) {
                loc = tail_locs[r % T];
                ++n_tail;
            } else if (r < tail_hi && page_ready[r / p]) {
                loc = page_map[r / p] * p + r % p;
                ++n_opt;
            } else if (r < nbits) {
                loc = SENTINEL;
                atomicOr(&need_bm[r >> 5], 1u << (r & 31));
            } else {
                status |= ST_ROW_RANGE;
            }
        }
        l_b[e] = loc;
    }
    block_add(&cnt[0], n_tail);
    block_add(&cnt[1], n_opt);
    if (status) atomicOr(&cnt[6], (unsigned long long)status);
    __syncthreads();
    for (int w = threadIdx.x; w < W; w += NT) miss_bm[w] = need_bm[w];
    const unsigned u = bitmap_prefix(need_bm, need_pre, W, tmp);  // syncs

    unsigned m = 0, nv = 0;
    if (u > 0 && B == 0) {
        if (threadIdx.x == 0) atomicOr(&cnt[6], (unsigned long long)ST_NOT_RESIDENT);
    } else if (u > 0) {
        // step 2: scan the B hot slots against the union (bounded by B, not by history)
        const i64* hot_rows = ptr<const i64>(row, T_HOT_ROWS);
        const i64* stamp = ptr<const i64>(row, T_HOT_STAMP);
        const i64* protect = ptr<const i64>(row, T_HOT_PROTECT);
        const i64* hot_locs = ptr<const i64>(row, T_HOT_LOCS);
        unsigned n_cand = 0;
        for (int s = threadIdx.x; s < Bp; s += NT) {
            unsigned long long key = ~0ull;
            if (s < B) {
                const i64 hr = hot_rows[s];
                if (hr >= 0 && hr < nbits && test_bit(need_bm, hr)) {
                    need_loc[(i64)b * Kk + rank_of(need_bm, need_pre, hr)] = hot_locs[s];
                    atomicAnd(&miss_bm[hr >> 5], ~(1u << (hr & 31)));
                    hit_slots[(i64)b * B + atomicAdd(&cnt[4], 1ull)] = s;
                } else if (protect[s] <= finished_epoch) {
                    key = ((unsigned long long)stamp[s] << 20) | (unsigned)s;  // (stamp, slot)
                    ++n_cand;
                }
            }
            keys[s] = key;
        }
        block_add(&cnt[5], n_cand);
        __syncthreads();
        m = bitmap_prefix(miss_bm, miss_pre, W, tmp);  // syncs
        // pass 2: entries of the union get a hot location or an encoded miss rank
        unsigned n_hot = 0, n_host = 0;
        for (int e = threadIdx.x; e < Kk; e += NT) {
            if (l_b[e] != SENTINEL) continue;
            const i64 r = s_b[e];
            if (test_bit(miss_bm, r)) {
                l_b[e] = -2 - (i64)rank_of(miss_bm, miss_pre, r);
                ++n_host;
            } else {
                l_b[e] = need_loc[(i64)b * Kk + rank_of(need_bm, need_pre, r)];
                ++n_hot;
            }
        }
        block_add(&cnt[2], n_hot);
        block_add(&cnt[3], n_host);
        if (m > 0) {
            // misses in ascending row order
            const int chunk = (W + NT - 1) / NT, lo = threadIdx.x * chunk, hi = min(W, lo + chunk);
            for (int w = lo; w < hi; ++w) {
                unsigned bits = miss_bm[w], i = miss_pre[w];
                while (bits) {
                    const int bit = __ffs(bits) - 1;
                    bits &= bits - 1;
                    misses[(i64)b * Kk + i++] = (i64)w * 32 + bit;
                }
            }
            // step 3: LRU order of the candidates, (stamp, slot) ascending (bitonic sort)
            for (int kk = 2; kk <= Bp; kk <<= 1) {
                for (int j = kk >> 1; j > 0; j >>= 1) {
                    for (int i = threadIdx.x; i < Bp; i += NT) {
                        const int ixj = i ^ j;
                        if (ixj > i) {
                            const unsigned long long a = keys[i], c = keys[ixj];
                            if ((a > c) == ((i & kk) == 0)) {
                                keys[i] = c;
                                keys[ixj] = a;
                            }
                        }
                    }
                    __syncthreads();
                }
            }
            nv = min((unsigned)m, (unsigned)cnt[5]);
            for (int i = threadIdx.x; i < (int)nv; i += NT)
                victims[(i64)b * B + i] = (i32)(keys[i] & 0xFFFFFull);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        i64* sm = summary + (i64)b * SCOLS;
        sm[S_STATUS] = (i64)cnt[6];
        sm[S_U] = u;
        sm[S_M] = m;
        sm[S_NV] = nv;
        sm[S_NHIT] = (i64)cnt[4];
        sm[S_TAIL] = (i64)cnt[0];
        sm[S_OPT] = (i64)cnt[1];
        sm[S_HOT] = (i64)cnt[2];
        sm[S_HOST] = (i64)cnt[3];
        sm[S_DIRECT] = u == 0;
        __threadfence();
        const unsigned long long t = atomicAdd(reinterpret_cast<unsigned long long*>(&totals[R_TICKET]), 1ull);
        last = (t == (unsigned long long)(batch - 1));
    }
    __syncthreads();
    if (!last) return;
    // last block: offsets and totals over the batch (batch <= NT), then reset the ticket
    __threadfence();
    i64* copy_off = totals + TOT_COLS;
    i64* stage_off = copy_off + batch + 1;
    const volatile i64* vs = summary;
    unsigned mm = 0, st = 0;
    if (threadIdx.x < batch) {
        mm = (unsigned)vs[threadIdx.x * SCOLS + S_M];
        st = mm - (unsigned)vs[threadIdx.x * SCOLS + S_NV];
    }
    unsigned tot_m, tot_s;
    const unsigned om = block_scan(mm, tmp, &tot_m);
    const unsigned os = block_scan(st, tmp, &tot_s);
    if (threadIdx.x < batch) {
        copy_off[threadIdx.x] = om;
        stage_off[threadIdx.x] = os;
    }
    if (threadIdx.x < 8) cnt[threadIdx.x] = 0ull;
    __syncthreads();
    if (threadIdx.x < batch) {
        const volatile i64* sm = vs + threadIdx.x * SCOLS;
        atomicOr(&cnt[0], (unsigned long long)sm[S_STATUS]);
        atomicAdd(&cnt[1], (unsigned long long)sm[S_TAIL]);
        atomicAdd(&cnt[2], (unsigned long long)sm[S_OPT]);
        atomicAdd(&cnt[3], (unsigned long long)sm[S_HOT]);
        atomicAdd(&cnt[4], (unsigned long long)sm[S_HOST]);
        atomicAdd(&cnt[5], (unsigned long long)sm[S_DIRECT]);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        copy_off[batch] = tot_m;
        stage_off[batch] = tot_s;
        totals[R_STATUS] = (i64)cnt[0];
        totals[R_COPIES] = tot_m;
        totals[R_STAGED] = tot_s;
        totals[R_TAIL] = (i64)cnt[1];
        totals[R_OPT] = (i64)cnt[2];
        totals[R_HOT] = (i64)cnt[3];
        totals[R_HOST] = (i64)cnt[4];
        totals[R_DIRECT] = (i64)cnt[5];
        totals[R_TICKET] = 0;
    }
}

// Copy item -> (request, miss index) by binary search over copy offsets in shared memory.
__device__ __forceinline__ int find_request(const i64* off, int batch, i64 c) {
    int lo = 0, hi = batch;  // off[lo] <= c < off[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (off[mid] <= c) lo = mid; else hi = mid;
    }
    return lo;
}

template <int W>
__device__ void copy_misses(const i64* __restrict__ table, const i64* __restrict__ misses,
                            const i32* __restrict__ victims, const i64* __restrict__ summary,
                            const i64* __restrict__ stage_locs, const i64* __restrict__ host_ptrs,
                            const i64* __restrict__ payload_ptrs, int n_layers, int batch, int Kk, int B,
                            unsigned row_bytes, const i64* s_off, const i64* s_soff, i64 n_copies,
                            int cblock, int ncblocks) {
    using V = typename Vec<W>::T;
    const unsigned vpr = row_bytes / W;
    const i64 per_layer = n_copies * vpr, total = per_layer * n_layers;
    const i64 stride = (i64)ncblocks * blockDim.x;
    constexpr int U = 4;
    for (i64 base = (i64)cblock * blockDim.x + threadIdx.x; base < total; base += stride * U) {
        V v[U];
        char* d[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const i64 it = base + u * stride;
            if (it < total) {
                const int layer = (int)(it / per_layer);
                const i64 li = it - layer * per_layer;
                const i64 c = li / vpr;
                const unsigned vec = (unsigned)(li - c * vpr);
                const int b = find_request(s_off, batch, c);
                const i64 i = c - s_off[b];
                const i64* sm = summary + (i64)b * SCOLS;
                const i64 nv = sm[S_NV];
                const i64 dst = i < nv ? reinterpret_cast<const i64*>(table[(i64)b * TCOLS + T_HOT_LOCS])
                                                 [victims[(i64)b * B + i]]
                                           : stage_locs[s_soff[b] + i - nv];
                const i64 r = misses[(i64)b * Kk + i];
                const char* src = reinterpret_cast<const char*>(host_ptrs[(i64)layer * batch + b]);
                v[u] = *reinterpret_cast<const V*>(src + r * row_bytes + (i64)vec * W);
                d[u] = reinterpret_cast<char*>(payload_ptrs[layer]) + dst * row_bytes + (i64)vec * W;
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (base + u * stride < total) *reinterpret_cast<V*>(d[u]) = v[u];
    }
}

// grid: [0, batch) commit blocks, [batch, gridDim.x) copy blocks (n_layers may be 0).
template <int W>
__device__ void commit_body(const i64* __restrict__ table, const i64* __restrict__ sel,
                            i64* __restrict__ locs, i64* __restrict__ miss_dst,
                            const i64* __restrict__ misses, const i32* __restrict__ victims,
                            const i32* __restrict__ hit_slots, const i64* __restrict__ summary,
                            i64* __restrict__ totals, const i64* __restrict__ stage_locs,
                            i64 n_stage_locs, i64* __restrict__ copy_batch, i64* __restrict__ copy_rows,
                            i64* __restrict__ copy_dst, i64* __restrict__ staged_rows,
                            const i64* __restrict__ host_ptrs, const i64* __restrict__ payload_ptrs,
                            int n_layers, int batch, int K, int k, int B, unsigned row_bytes, i64 epoch) {
    __shared__ i64 s_off[MAXB + 1], s_soff[MAXB + 1];
    __shared__ int s_ok;
    const int Kk = K * k;
    if (threadIdx.x == 0) {
        const i64 staged = totals[R_STAGED];
        s_ok = totals[R_STATUS] == 0 && staged <= n_stage_locs;
        if (!s_ok && blockIdx.x == 0 && totals[R_STATUS] == 0) totals[R_STATUS] = ST_STAGING;
    }
    __syncthreads();
    if (!s_ok) return;
    const i64* copy_off = totals + TOT_COLS;
    const i64* stage_off = copy_off + batch + 1;
    if ((int)blockIdx.x >= batch) {
        const i64 n_copies = totals[R_COPIES];
        if (n_copies == 0 || n_layers == 0) return;
        for (int i = threadIdx.x; i <= batch; i += blockDim.x) {
            s_off[i] = copy_off[i];
            s_soff[i] = stage_off[i];
        }
        __syncthreads();
        copy_misses<W>(table, misses, victims, summary, stage_locs, host_ptrs, payload_ptrs, n_layers, batch, Kk,
                       B, row_bytes, s_off, s_soff, n_copies, blockIdx.x - batch, gridDim.x - batch);
        return;
    }
    const int b = blockIdx.x;
    const i64* row = table + (i64)b * TCOLS;
    const i64* sm = summary + (i64)b * SCOLS;
    if (sm[S_U] == 0) return;  // direct lookup: no LRU change
    const i64 m = sm[S_M], nv = sm[S_NV], nhit = sm[S_NHIT], off = copy_off[b], soff = stage_off[b];
    i64* hot_rows = ptr<i64>(row, T_HOT_ROWS);
    i64* stamp = ptr<i64>(row, T_HOT_STAMP);
    i64* protect = ptr<i64>(row, T_HOT_PROTECT);
    const i64* hot_locs = ptr<const i64>(row, T_HOT_LOCS);
    for (i64 i = threadIdx.x; i < m; i += blockDim.x) {
        const i64 r = misses[(i64)b * Kk + i];
        i64 dst;
        if (i < nv) {
            const int s = victims[(i64)b * B + i];
            dst = hot_locs[s];
            hot_rows[s] = r;
            stamp[s] = epoch;
            protect[s] = epoch;
        } else {
            dst = stage_locs[soff + i - nv];
            staged_rows[soff + i - nv] = r;
        }
        miss_dst[(i64)b * Kk + i] = dst;
        copy_batch[off + i] = b;
        copy_rows[off + i] = r;
        copy_dst[off + i] = dst;
    }
    for (i64 h = threadIdx.x; h < nhit; h += blockDim.x) {
        const int s = hit_slots[(i64)b * B + h];
        stamp[s] = epoch;
        protect[s] = epoch;
    }
    __syncthreads();
    i64* l_b = locs + (i64)b * Kk;
    for (int e = threadIdx.x; e < Kk; e += blockDim.x) {
        const i64 l = l_b[e];
        if (l < -1) l_b[e] = miss_dst[(i64)b * Kk + (-2 - l)];
    }
}

#define COMMIT(W)                                                                                              \
    extern "C" __global__ void __launch_bounds__(512) resolve_commit_##W(                                      \
        const i64* table, const i64* sel, i64* locs, i64* miss_dst, const i64* misses,    \
        const i32* victims, const i32* hit_slots, const i64* summary, i64* totals,            \
        const i64* stage_locs, i64 n_stage_locs, i64* copy_batch, i64* copy_rows,             \
        i64* copy_dst, i64* staged_rows, const i64* host_ptrs, const i64* payload_ptrs,       \
        int n_layers, int batch, int K, int k, int B, unsigned row_bytes, i64 epoch) {                    \
        commit_body<W>(table, sel, locs, miss_dst, misses, victims, hit_slots, summary, totals, stage_locs,   \
                       n_stage_locs, copy_batch, copy_rows, copy_dst, staged_rows, host_ptrs, payload_ptrs,   \
                       n_layers, batch, K, k, B, row_bytes, epoch);                                            \
    }
COMMIT(16)
COMMIT(8)
COMMIT(4)

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
    constexpr int U = 4;
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
