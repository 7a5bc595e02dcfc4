#ifndef DHISPARSE_RESOLVER_COMMON_CUH
#define DHISPARSE_RESOLVER_COMMON_CUH
// Fused resolver (DESIGN 3.2) over services/decode/hierarchy's layout, in two launches.
//
//   launch 1  resolve_lookup      grid = batch blocks (one per request), 1024 threads
//             direct path (tail, ready optional page), hot hits by the request's row ->
//             slot index (hot_index: one load per entry, the location packed in), the
//             misses as a bitmap over source rows [0, nbits) in shared memory (a set bit = a
//             row some query misses; ranks by word prefix + popcount give the ascending
//             order of the union, eq. 6, for free), the hit slots as a bitmap over the B
//             slots, LRU victims among the unprotected, non-hit slots by a radix select (or
//             a bitonic sort) of (stamp, slot) keys, listed in slot order from a bitmap
//             (all candidates need neither). With hits = 1 the hits come from the
//             request's hot_rank cache instead of hot_index (resolver_rank.cuh; rebuilt and
//             written back where stale). Mutates no other state: writes per-request
//             scratch and a summary row; with sums = 1 (a host reads the totals between
//             the launches: the drop-in path) the last block to finish (atomic ticket) sums
//             the summaries into offsets (copies, staging) and totals; with sums = 0 (the
//             sync-free path) launch 2 does that itself (sum_batch), one step shorter.
//   launch 2  resolve_commit      grid = batch x parts commit blocks + copy blocks
//             commit block (b, part): victims take the misses (ascending rows; hot_index
//             follows: the evicted rows leave it, the misses enter), hit and victim
//             slots get stamp = epoch (each part stamps the hits of its share of
//             the slots), staged rows take stage_locs in order, locations are finished in
//             selection order, the plan's copy list is written (part 0).
//             copy blocks: the union of every request's misses, flattened into 16-byte
//             items over (layer, request, row, vector) -- i.e. ascending host address
//             within a request -- spread over all copy blocks, read from mapped host
//             memory. On the sync-free path with sparse misses the first COPY_BLOCKS_MIN
//             (COPY_BLOCKS_FEW where the call has few misses, copied by loads; copy_few)
//             of them do not wait for the whole lookup grid first: each waits for every
//             request's miss count (S_EARLY, published once the request's misses are
//             listed), then issues its first round of host reads while the lookup blocks
//             still choose victims (preload; stores only after the grid ended). Nothing is
//             mutated or copied when status != 0 (bad input, staging arena too small):
//             the host raises with the group unchanged.
// No host synchronization between or inside the launches.
// Source layout: resolver_common.cuh (types, table/summary/totals columns, trace,
// block helpers), resolver_lookup.cu (launch 1), resolver_commit.cu (launch 2, plan
// copies). kernels/_loader.py compiles the three as one NVRTC source, in that order.

// No std headers: NVRTC (CuPy) compiles this without a host C++ library.
typedef long long i64;
typedef int i32;
typedef unsigned short u16;

#ifndef NT  // threads per block of the lookup and promote kernels; -DNT=512 builds the
#define NT 1024  // lookup of two 512-thread blocks per SM (kernels/resolver_settings.py lookup_shape)
#endif
#define MAXB 1024  // batch limit (shared offsets of the copy blocks)
static_assert(NT % 32 == 0 && NT >= MAXB / 2, "sum_batch takes 2 requests per thread, whole warps");

template <int W> struct Vec;
template <> struct Vec<16> { using T = uint4; };
template <> struct Vec<8> { using T = uint2; };
template <> struct Vec<4> { using T = unsigned int; };
#define SENTINEL (-9223372036854775807LL - 1)

// request table columns (int64 [batch, TCOLS], built by kernels/resolver.py)
// T_MAP_HI: logical pages at or past it hold no physical page (page_map -1, page_ready
// false; RequestState.map_hi), so the lookup loads neither for rows at or past map_hi * p
enum { T_HOT_ROWS, T_HOT_STAMP, T_HOT_LOCS, T_TAIL_LOCS, T_PAGE_MAP, T_PAGE_READY, T_HOT_INDEX,
       T_HOT_RANK, T_RANK_CAP, T_TAIL_LO, T_TAIL_HI, T_MAP_HI, TCOLS };
// hot_index [max_rows] (request.py): -1, or hot_locs[s] << HOT_SLOT_BITS | s for the slot s
// holding the row; kept the inverse of hot_rows by the commit and the promotion
#define HOT_SLOT_BITS 20
#define HOT_SLOT_MASK 0xFFFFFll
// hot_rank (request.py): header, the held rows' hot_index entries in ascending row order (B
// rounded up to even), a bitmap of the held rows (T_RANK_CAP u32 words), then its exclusive
// prefix of set bits (T_RANK_CAP u16, 16-byte aligned) -- the rank lookup's cache
// (resolver_rank.cuh), valid while RANK_BUILT == RANK_VERSION; every writer of hot_rows
// bumps RANK_VERSION
enum { RANK_VERSION, RANK_BUILT, RANK_WORDS, RANK_HEAD = 4 };
// summary columns (int64 [batch, SCOLS]). S_EARLY: on the sync-free path the lookup block
// publishes (call << 32 | m) there as soon as its misses are listed, before it chooses the
// victims; the commit's copy blocks wait for every request's and start reading host rows
// while the lookup still runs (see resolver_commit.cu)
enum { S_STATUS, S_U, S_M, S_NV, S_NHIT, S_TAIL, S_OPT, S_HOT, S_HOST, S_DIRECT, S_EARLY, SCOLS };
// totals (int64 [TOT_COLS + 2 * (batch + 1)]): then copy offsets [batch+1], stage offsets [batch+1].
// R_PEND + 2 p + {P_COPIES, P_STATUS}: on the sync-free path (sums = 0) every lookup block
// adds its misses and ORs its status into the slots of parity p (the host alternates it call
// by call); the commit reads them once, and when both are 0 (no copies, hence nothing staged,
// and good input) no block but one sums the batch; that block also clears parity p ^ 1 for
// the next call. A slot left dirty (a lookup without its commit) only sends a call down the
// summing path.
// R_PRELOADS: copy blocks that preloaded (resolver_commit.cu), over every call of the
// workspace (the tests read it; never reset)
enum { R_STATUS, R_COPIES, R_STAGED, R_TAIL, R_OPT, R_HOT, R_HOST, R_DIRECT, R_TICKET, R_PEND,
       R_PRELOADS = R_PEND + 4, TOT_COLS };
enum { P_COPIES, P_STATUS };
// status bits
enum { ST_SEL_LT_M1 = 1, ST_VISIBLE = 2, ST_SEL_GE_VISIBLE = 4, ST_NOT_RESIDENT = 8, ST_ROW_RANGE = 16,
       ST_STAGING = 32 };

// Phase trace (bench/resolver/trace.py): compiled in only with -DRESOLVER_TRACE. Thread 0
// of block TRACE_BLOCK (in the commit launch the block of that role, block_role) stamps
// %globaltimer (ns) at each phase boundary of both launches
// into g_trace[slot]; slot 0..15 lookup, 16..23 commit block, 24..31 the last lookup block.
#ifdef RESOLVER_TRACE
__device__ unsigned long long g_trace[32];
__device__ int g_trace_block;
#define TRACE_AT(slot, index)                                                     \
    do {                                                                          \
        if (threadIdx.x == 0 && (index) == g_trace_block) {                       \
            unsigned long long t_;                                                \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                \
            g_trace[slot] = t_;                                                   \
        }                                                                         \
    } while (0)
#define TRACE(slot) TRACE_AT(slot, (int)blockIdx.x)
// the stamp waits for `value` (a load's result): when it arrived
#define TRACE_DEP(slot, value) TRACE_DEP_AT(slot, (int)blockIdx.x, value)
#define TRACE_DEP_AT(slot, index, value)                                          \
    do {                                                                          \
        if (threadIdx.x == 0 && (index) == g_trace_block) {                       \
            unsigned long long t_;                                                \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_) : "l"((unsigned long long)(value))); \
            g_trace[slot] = t_;                                                   \
        }                                                                         \
    } while (0)
#define TRACE_ANY(slot)                                                           \
    do {                                                                          \
        if (threadIdx.x == 0) {                                                   \
            unsigned long long t_;                                                \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                \
            g_trace[slot] = t_;                                                   \
        }                                                                         \
    } while (0)
#else
#define TRACE_AT(slot, index) do {} while (0)
#define TRACE(slot) do {} while (0)
#define TRACE_DEP(slot, value) do {} while (0)
#define TRACE_DEP_AT(slot, index, value) do {} while (0)
#define TRACE_ANY(slot) do {} while (0)
#endif

template <typename T> __device__ __forceinline__ T* ptr(const i64* row, int col) {
    return reinterpret_cast<T*>(row[col]);
}

__device__ __forceinline__ void prefetch_l2(const void* at) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
}

// Release store / acquire load of one 64-bit word at GPU scope (a flag between blocks of
// different grids that run at the same time).
__device__ __forceinline__ void st_release(i64* at, i64 v) {
    asm volatile("st.release.gpu.global.b64 [%0], %1;" ::"l"(at), "l"(v) : "memory");
}
__device__ __forceinline__ i64 ld_acquire(const i64* at) {
    i64 v;
    asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(at) : "memory");
    return v;
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

// Exclusive prefix (uint16) of popcounts of `bm[0..Wp)`, Wp a multiple of 4 (16-byte aligned
// bitmap): thread t owns a contiguous chunk of 16-byte groups (one group while Wp <= 4 * NT).
__device__ unsigned bitmap_prefix(const unsigned* bm, u16* pre, int Wp, unsigned* tmp) {
    const uint4* bm4 = reinterpret_cast<const uint4*>(bm);
    const int g = Wp >> 2, chunk = (g + NT - 1) / NT, lo = threadIdx.x * chunk, hi = min(g, lo + chunk);
    unsigned s = 0;
    for (int i = lo; i < hi; ++i) {
        const uint4 x = bm4[i];
        s += __popc(x.x) + __popc(x.y) + __popc(x.z) + __popc(x.w);
    }
    unsigned total;
    unsigned run = block_scan(s, tmp, &total);
    for (int i = lo; i < hi; ++i) {
        const uint4 x = bm4[i];
        const unsigned a = run, b = a + __popc(x.x), c = b + __popc(x.y), d = c + __popc(x.z);
        run = d + __popc(x.w);
        reinterpret_cast<uint2*>(pre)[i] = make_uint2((a & 0xFFFFu) | (b << 16), (c & 0xFFFFu) | (d << 16));
    }
    __syncthreads();
    return total;
}

// Zero (src == nullptr) or copy Wp words (a multiple of 4, 16-byte aligned) of shared memory.
__device__ __forceinline__ void bitmap_fill(unsigned* dst, const unsigned* src, int Wp) {
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    for (int i = threadIdx.x; i < (Wp >> 2); i += NT) d4[i] = src ? s4[i] : make_uint4(0u, 0u, 0u, 0u);
}

// row: i64, or int where the caller's rows fit (the lookup's pass 1)
template <typename Row>
__device__ __forceinline__ unsigned rank_of(const unsigned* bm, const u16* pre, Row row) {
    const int w = (int)(row >> 5), bit = (int)(row & 31);
    return pre[w] + __popc(bm[w] & ((1u << bit) - 1u));
}

template <typename Row>
__device__ __forceinline__ bool test_bit(const unsigned* bm, Row row) {
    return (bm[row >> 5] >> (row & 31)) & 1u;
}

// 32-bit: a 64-bit shared atomic is a compare-and-swap loop on sm_90 (ATOMS.CAST.SPIN.64),
// slow under the contention of 32 warps; every count here stays below 2^32 (MAXB * 65535).
// The warp's sum is one redux.sync; one shared atomic per warp.
__device__ __forceinline__ void block_add(unsigned* dst, unsigned v) {
    v = __reduce_add_sync(0xffffffffu, v);
    if ((threadIdx.x & 31) == 0 && v) atomicAdd(dst, v);
}

// The batch sums over the per-request summaries, by one block: the lookup's last block (the
// drop-in path: write_totals, no shared outputs) or every block of the commit launch (the
// sync-free path: each sums for its own s_off / s_soff [0, batch] -- exclusive copy and
// staging offsets -- and *ok, status 0 and staging fits; the last block also writes the totals;
// with nothing pending (R_PEND) the other blocks skip it).
// write_totals: totals and the offsets after them, status | ST_STAGING when the staged rows
// exceed n_stage_locs. A batch of <= 32 is summed by one warp (shuffles, one barrier); up to
// MAXB by the block, 2 requests per thread (blockDim.x >= MAXB / 2). Ends with a barrier;
// every thread of the block must call it. Reads the summaries through L2 (__ldcg): they
// were written by other blocks.
__device__ void sum_batch(const i64* __restrict__ summary, i64* __restrict__ totals, int batch,
                          i64 n_stage_locs, bool write_totals, i64* s_off, i64* s_soff, int* ok,
                          unsigned* tmp, unsigned* cnt) {
    const int lane = threadIdx.x & 31;
    i64* copy_off = totals + TOT_COLS;
    i64* stage_off = copy_off + batch + 1;
    unsigned f[SCOLS];
    unsigned tot_m, tot_s, st;
    if (batch <= 32) {
        if (threadIdx.x < 32) {
#pragma unroll
            for (int c = 0; c < SCOLS; ++c)
                f[c] = lane < batch && c != S_EARLY && (write_totals || c == S_STATUS || c == S_M || c == S_NV)
                           ? (unsigned)__ldcg(summary + lane * SCOLS + c) : 0u;
            unsigned im = f[S_M], is = f[S_M] - f[S_NV];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned ym = __shfl_up_sync(0xffffffffu, im, o), ys = __shfl_up_sync(0xffffffffu, is, o);
                if (lane >= o) im += ym, is += ys;
            }
            tot_m = __shfl_sync(0xffffffffu, im, 31), tot_s = __shfl_sync(0xffffffffu, is, 31);
            st = __reduce_or_sync(0xffffffffu, f[S_STATUS]);
            if (s_off && lane < batch) {
                s_off[lane] = im - f[S_M];
                s_soff[lane] = is - (f[S_M] - f[S_NV]);
            }
            if (s_off && lane == 0) {
                s_off[batch] = tot_m, s_soff[batch] = tot_s;
                *ok = st == 0 && (i64)tot_s <= n_stage_locs;
            }
            if (write_totals) {
                const unsigned tail = __reduce_add_sync(0xffffffffu, f[S_TAIL]), opt = __reduce_add_sync(0xffffffffu, f[S_OPT]);
                const unsigned hot = __reduce_add_sync(0xffffffffu, f[S_HOT]), host = __reduce_add_sync(0xffffffffu, f[S_HOST]);
                const unsigned direct = __reduce_add_sync(0xffffffffu, f[S_DIRECT]);
                if (lane < batch) {
                    copy_off[lane] = im - f[S_M];
                    stage_off[lane] = is - (f[S_M] - f[S_NV]);
                }
                if (lane == 0) {
                    copy_off[batch] = tot_m, stage_off[batch] = tot_s;
                    totals[R_STATUS] = st ? st : (i64)tot_s > n_stage_locs ? ST_STAGING : 0;
                    totals[R_COPIES] = tot_m, totals[R_STAGED] = tot_s;
                    totals[R_TAIL] = tail, totals[R_OPT] = opt, totals[R_HOT] = hot;
                    totals[R_HOST] = host, totals[R_DIRECT] = direct;
                }
            }
        }
        __syncthreads();
        return;
    }
    // thread t: requests 2t, 2t + 1
    unsigned mv[2] = {0u, 0u}, sv[2] = {0u, 0u};
#pragma unroll
    for (int c = 0; c < SCOLS; ++c) f[c] = 0u;
    if (threadIdx.x < 8) cnt[threadIdx.x] = 0u;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int i = 2 * threadIdx.x + j;
        if (i >= batch) continue;
        const i64* sm = summary + (i64)i * SCOLS;
        mv[j] = (unsigned)__ldcg(sm + S_M);
        sv[j] = mv[j] - (unsigned)__ldcg(sm + S_NV);
        f[S_STATUS] |= (unsigned)__ldcg(sm + S_STATUS);
        if (write_totals) {
#pragma unroll
            for (int c = S_TAIL; c <= S_DIRECT; ++c) f[c] += (unsigned)__ldcg(sm + c);
        }
    }
    unsigned om = block_scan(mv[0] + mv[1], tmp, &tot_m);  // syncs (orders the cnt reset too)
    unsigned os = block_scan(sv[0] + sv[1], tmp, &tot_s);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int i = 2 * threadIdx.x + j;
        if (i >= batch) continue;
        if (s_off) s_off[i] = om, s_soff[i] = os;
        if (write_totals) copy_off[i] = om, stage_off[i] = os;
        om += mv[j], os += sv[j];
    }
    st = __reduce_or_sync(0xffffffffu, f[S_STATUS]);
    if (lane == 0 && st) atomicOr(&cnt[0], st);
    if (write_totals) {
        block_add(&cnt[1], f[S_TAIL]);
        block_add(&cnt[2], f[S_OPT]);
        block_add(&cnt[3], f[S_HOT]);
        block_add(&cnt[4], f[S_HOST]);
        block_add(&cnt[5], f[S_DIRECT]);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        st = cnt[0];
        if (s_off) {
            s_off[batch] = tot_m, s_soff[batch] = tot_s;
            *ok = st == 0 && (i64)tot_s <= n_stage_locs;
        }
        if (write_totals) {
            copy_off[batch] = tot_m, stage_off[batch] = tot_s;
            totals[R_STATUS] = st ? st : (i64)tot_s > n_stage_locs ? ST_STAGING : 0;
            totals[R_COPIES] = tot_m, totals[R_STAGED] = tot_s;
            totals[R_TAIL] = cnt[1], totals[R_OPT] = cnt[2], totals[R_HOT] = cnt[3];
            totals[R_HOST] = cnt[4], totals[R_DIRECT] = cnt[5];
        }
    }
    __syncthreads();
}

// Compile-time count for the unrolled entry loops (chosen at run time from K * k).
template <int N> struct Groups { static constexpr int value = N; };
template <bool V> struct Flag { static constexpr bool value = V; };
template <bool C, typename A, typename B> struct Pick { using T = A; };
template <typename A, typename B> struct Pick<false, A, B> { using T = B; };

#define U 4  // loads in flight per thread (commit and copy loops; lookup passes take UL)

#endif  // DHISPARSE_RESOLVER_COMMON_CUH
