// Launch 1 of the fused resolver (see resolver_common.cuh): direct path, union bitmap,
// hot hits by the row -> slot index, LRU victims, per-request summaries and the batch totals.
#include "resolver_common.cuh"
#include "resolver_rank.cuh"
#include "resolver_victims.cuh"

// Whether every query of a request selects the first's rows with a visible bound no lower
// than the first's (s_b: the request's K x k selections, vis_b: its K bounds): the round's K
// queries sharing one selection, under causal bounds (eq. 5: they grow with the query). Then
// an entry of any query is valid exactly where the first query's is on a call without bad
// entries, and flagged where it is on one with them (a row at or past a later query's bound
// is past the first's). Asked after pass 1 has looked up the first query (the others' rows
// were asked of L2 at the start, so its loads meet them there). Every thread calls it;
// block-uniform result, and a barrier.
__device__ __forceinline__ bool same_queries(const i64* __restrict__ s_b, const i64* __restrict__ vis_b, int K,
                                             int k) {
    bool diff = false;
    for (int j = threadIdx.x; j < K; j += NT) diff |= vis_b[j] < vis_b[0];
    for (int i0 = threadIdx.x; i0 < k; i0 += 2 * NT) {
        i64 f[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) f[q] = i0 + q * NT < k ? s_b[i0 + q * NT] : 0;
#ifdef RESOLVER_SAME_UNROLL4  // diagnostic build: the loop before run 156 (4 queries' loads at a time)
#pragma unroll 4
        for (int j = 1; j < K; ++j)
#pragma unroll
            for (int q = 0; q < 2; ++q)
                if (i0 + q * NT < k) diff |= s_b[(i64)j * k + i0 + q * NT] != f[q];
#else
        // 7 queries' loads at a time (K = 8: every load in flight before the first compare):
        // K = 8 calls without misses 0.9 us faster at batch 32 and 1.7 at batch 160 than with
        // 4 at a time (in every round of runs 156-157); cold calls within their spread (656 B,
        // batch 32: -1.9 us over run 156's 8 rounds, +5.1 over run 157's 3; H200). The
        // 1024-thread kernels' spills unchanged, the 512-thread rank kernels' 12 bytes more
        for (int j0 = 1; j0 < K; j0 += 7) {
            i64 g[7][2];
#pragma unroll
            for (int u = 0; u < 7; ++u)
#pragma unroll
                for (int q = 0; q < 2; ++q)
                    g[u][q] = j0 + u < K && i0 + q * NT < k ? s_b[(i64)(j0 + u) * k + i0 + q * NT] : f[q];
#pragma unroll
            for (int u = 0; u < 7; ++u)
#pragma unroll
                for (int q = 0; q < 2; ++q) diff |= g[u][q] != f[q];
        }
#endif
    }
    return !__syncthreads_or(diff);
}

// shared layout of resolve_lookup (dynamic), Wp = W rounded up to a multiple of 4, Hp =
// Bp / 32: miss bitmap [Wp] u32, hit bitmap over the slots [Hp] u32, miss prefix [Wp] u16,
// then LRU keys [Bp] u64 (the bitmaps move in 16-byte groups); with hits = 1 (the rank form,
// resolver_rank.cuh) also the held-row bitmap [Wp] u32 (at the next 16-byte boundary) and
// its prefix [Wp] u16, and the held rows' entries by rank in the keys' place until pass 1 ends.
// UL: slot groups per thread in the victim keys; entry loops run G groups (G * NT >= K * k
// where possible: a group past the last entry would still cost its instructions).
template <int UL, bool RANK, bool SAME>
__device__ __forceinline__ void lookup_body(
    const i64* __restrict__ table, const i64* __restrict__ sel, const i64* __restrict__ visible,
    i64* __restrict__ locs, i64* __restrict__ miss_dst, i64* __restrict__ misses,
    i32* __restrict__ victims, i32* __restrict__ hit_mask, i64* __restrict__ summary,
    i64* __restrict__ totals, int batch, int K, int k, int B, int Bp, int T, int p, int W,
    i64 finished_epoch, int select_mode, int sums, int parity, int call) {
    (void)miss_dst;  // the commit's scratch (both launches take the workspace's pointers)
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ unsigned tmp[33];
    __shared__ unsigned cnt[8];  // tail, opt, hot, host, hit slots, ncand, status (32-bit: block_add)
    __shared__ int last;
    const int b = blockIdx.x, Kk = K * k, Wp = (W + 3) & ~3, Hp = Bp >> 5;
    const i64* row = table + (i64)b * TCOLS;
    unsigned* miss_bm = reinterpret_cast<unsigned*>(smem);
    unsigned* hit_bm = miss_bm + Wp;
    u16* miss_pre = reinterpret_cast<u16*>(hit_bm + Hp);
    unsigned long long* keys = reinterpret_cast<unsigned long long*>(smem + (size_t)6 * Wp + (size_t)4 * Hp);
    const i64 tail_lo = row[T_TAIL_LO], tail_hi = row[T_TAIL_HI], map_hi = row[T_MAP_HI];
    const i64* tail_locs = ptr<const i64>(row, T_TAIL_LOCS);
    const i64* page_map = ptr<const i64>(row, T_PAGE_MAP);
    const bool* page_ready = ptr<const bool>(row, T_PAGE_READY);
    const i64* hot_index = ptr<const i64>(row, T_HOT_INDEX);
    const i64* s_b = sel + (i64)b * Kk;
    i64* l_b = locs + (i64)b * Kk;
    const i64 nbits = (i64)W * 32;
    const bool rank = RANK && B > 0;  // block-uniform (the index form compiles without it)
    // the rank form's cache and its size, loaded with the row's other columns (not after the
    // fills below): rank_cache's own loads then go out in one round trip
    i64* const rank_at = rank ? ptr<i64>(row, T_HOT_RANK) : nullptr;
    const i64 rank_cap = rank ? row[T_RANK_CAP] : 0;
    const size_t held_at = ((size_t)6 * Wp + (size_t)4 * Hp + (size_t)8 * Bp + 15) & ~(size_t)15;
    unsigned* held_bm = reinterpret_cast<unsigned*>(smem + held_at);  // 16-byte groups
    u16* held_pre = reinterpret_cast<u16*>(held_bm + Wp);
    TRACE(0);
#if __CUDA_ARCH__ >= 900
    // a commit launched behind this grid with PDL may be scheduled now (it waits for this
    // grid's completion before reading anything): its launch overlaps the lookup
    asm volatile("griddepcontrol.launch_dependents;");
#endif
    // the round's K queries sharing one selection (same_queries): pass 1 looks up the first
    // query's k entries, then asks whether the others are the same; if so pass 2 takes those
    // Ke = k entries, their locations go to the others' at the end and the entry counters
    // count every query's (the others' bounds are checked apart, ST_VISIBLE); if not, pass 1
    // goes on over the others' entries (it only adds: bitmaps, counters, their locations).
    // Only in the _q kernels (SAME), which the wrapper launches for K > 1, k > 0. With every entry
    // looked up K = 8 identical selections cost 1.003-1.04x K = 1 (runs 82-89); with the
    // check before pass 1 0.8% more at 656 B, cold, batch 32 (run 146), about 4.5 us of it
    // the check (run 147); with it here +5.6 us, 0.6% (run 150, 10 rounds; H200)
    const bool ask = SAME && K > 1;
    if (ask && !rank)  // the rank form asks for the whole selection below
        for (int i = threadIdx.x; i * 16 < Kk - k; i += NT) prefetch_l2(s_b + k + i * 16);

    if (rank) {  // into L2 while the block reads its cache: what pass 1 loads after it (the
        // selection, and the page map and flags of the pages below the tail)
        const int pages = (int)min((tail_lo + p - 1) / p, map_hi);
        for (int i = threadIdx.x; i * 16 < Kk; i += NT) prefetch_l2(s_b + i * 16);
        for (int i = threadIdx.x; i * 16 < pages; i += NT) prefetch_l2(page_map + i * 16);
        for (int i = threadIdx.x; i * 128 < pages; i += NT) prefetch_l2(page_ready + i * 128);
    }
    bitmap_fill(miss_bm, nullptr, Wp + Hp);
    if (threadIdx.x < 8) cnt[threadIdx.x] = 0u;
    TRACE_DEP(13, tail_hi);  // the table's row arrived
    if (rank) rank_cache(row, rank_at, B, W, Wp, rank_cap, held_bm, held_pre, keys, tmp);  // syncs
    __syncthreads();
    TRACE(2);  // the rank form's cache in shared memory

    // pass 1: direct path, then hot hits by the request's row -> slot index (one load
    // beside the page loads: hot_index packs the slot's pool row, so a hit's location
    // needs no further load); the misses become the union bitmap, hit slots a bitmap.
    // Entries go in groups of G per thread with every load of a group issued before the
    // first use (after the L2 flush each dependent load is an HBM round trip; batching
    // keeps G of them in flight). Row arithmetic is 32-bit when every row of the request
    // fits (64-bit division is a long instruction sequence on the GPU). Rows at or past
    // map_rows lie in pages that hold no physical page: no division, no page loads (a
    // request without optional or history pages, as the benchmark's, loads none).
    const bool small = tail_hi <= 0x7FFFFFFFll;
    const i64 map_rows = map_hi * p;
    const i64 vis1 = SAME ? visible[(i64)b * K] : K == 1 ? visible[b] : 0;  // the first query's bound
    unsigned n_tail = 0, n_opt = 0, n_hot = 0, n_host = 0, status = 0;
    // Row: the row arithmetic past the entry checks -- int where every row of the request
    // fits (small), else i64. The bounds it compares with are clamped to tail_hi: no valid
    // row reaches it. In 32 bits batch 160 without misses took 0.1-0.3 us less (H200, run 121).
    // entries [e_lo, e_hi); the first query's (e < k) under vis1 where the kernel has it
    auto pass1 = [&](auto groups, auto narrow, int e_lo, int e_hi) {
        constexpr int G = decltype(groups)::value;
        using Row = typename Pick<decltype(narrow)::value, int, i64>::T;
        const Row t_lo = (Row)tail_lo, t_hi = (Row)tail_hi;
        const Row m_rows = (Row)(map_rows < tail_hi ? map_rows : tail_hi);
        const Row n_bits = (Row)(nbits < tail_hi ? nbits : tail_hi);
        for (int e0 = e_lo + threadIdx.x; e0 < e_hi; e0 += NT * G) {
            i64 r[G], vis[G], loc[G], pm[G], hi[G];
            Row rw[G], pg[G];
            bool tail[G], page[G];
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const int e = e0 + q * NT;
                r[q] = e < e_hi ? s_b[e] : -1;
                if constexpr (SAME) vis[q] = e < k ? vis1 : e < e_hi ? visible[(i64)b * K + e / k] : 0;
                else vis[q] = K == 1 ? vis1 : e < e_hi ? visible[(i64)b * K + e / k] : 0;
            }
            if (e0 == e_lo + (int)threadIdx.x) TRACE_DEP(27, r[0]);  // the first selected row arrived
#pragma unroll
            for (int q = 0; q < G; ++q) {
                unsigned bad = 0;
                if (e0 + q * NT < e_hi) {
                    if (vis[q] < 0 || vis[q] > tail_hi) bad |= ST_VISIBLE;
                    if (r[q] < -1) bad |= ST_SEL_LT_M1;
                    if (r[q] >= vis[q]) bad |= ST_SEL_GE_VISIBLE;
                }
                status |= bad;
                // a flagged entry reads no table (may be out of range); a valid row is below
                // its bound, hence below tail_hi, so it fits Row
                rw[q] = bad || r[q] < 0 ? (Row)-1 : (Row)r[q];
                tail[q] = rw[q] >= t_lo && rw[q] < t_hi;
                const bool mapped = rw[q] >= 0 && rw[q] < m_rows;
                Row tl = 0;
                if constexpr (decltype(narrow)::value) {  // unsigned: the shorter division
                    pg[q] = mapped ? (Row)((unsigned)rw[q] / (unsigned)p) : 0;
                    tl = tail[q] ? (Row)((unsigned)rw[q] % (unsigned)T) : 0;
                } else {
                    pg[q] = mapped ? rw[q] / p : 0;
                    tl = tail[q] ? rw[q] % T : 0;
                }
                // page_map and hot_index beside page_ready (all indexed by the row), not
                // after it: no dependent round trip; each is unused where it does not apply
                const bool rest = rw[q] >= 0 && !tail[q];
                page[q] = rest && mapped && page_ready[pg[q]];
                pm[q] = rest && mapped ? page_map[pg[q]] : 0;
                if (RANK)
                    hi[q] = rest && rank && rw[q] < n_bits ? rank_entry(held_bm, held_pre, keys, rw[q]) : -1;
                else
                    hi[q] = rest && B > 0 && rw[q] < n_bits ? hot_index[rw[q]] : -1;
                loc[q] = tail[q] ? tail_locs[tl] : -1;
            }
            if (e0 == e_lo + (int)threadIdx.x) TRACE_DEP(28, hi[0] ^ loc[0]);  // its lookups done
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const int e = e0 + q * NT;
                if (page[q]) {
                    loc[q] = pm[q] * p + (rw[q] - pg[q] * p);
                    ++n_opt;
                } else if (tail[q]) {
                    ++n_tail;
                } else if (rw[q] >= 0) {
                    if (rw[q] >= n_bits) {
                        status |= ST_ROW_RANGE;
                    } else if (hi[q] >= 0) {
                        const unsigned s = (unsigned)(hi[q] & HOT_SLOT_MASK);
                        loc[q] = hi[q] >> HOT_SLOT_BITS;
                        atomicOr(&hit_bm[s >> 5], 1u << (s & 31));
                        ++n_hot;
                    } else {
                        loc[q] = SENTINEL;
                        atomicOr(&miss_bm[rw[q] >> 5], 1u << (rw[q] & 31));
                        ++n_host;
                    }
                }
                if (e < e_hi) l_b[e] = loc[q];
            }
        }
    };
    auto pass1_rows = [&](auto groups, int e_lo, int e_hi) {
        if (small) pass1(groups, Flag<true>{}, e_lo, e_hi);
        else pass1(groups, Flag<false>{}, e_lo, e_hi);
    };
    // G = 4 only where the entries' loads need the depth: not in the rank form of the
    // 512-thread build (the shape above the SM count, two blocks an SM), whose lookups are in
    // shared memory and whose selection was asked of L2 while the cache loaded. There G = 2
    // (less code to fetch after the L2 flush, fewer spills) took batch 160 without misses to
    // 20.1-20.4 us against 20.6-20.8 (656 B) and 20.6-20.7 against 21.3-21.7 (1152 B), calls
    // with misses within their spread (H200, a8f3055, run 133, call by call). Capped in every
    // kernel it cost batch 1 0.5 us (run 132), hence only here. RESOLVER_TWO_G4 (a diagnostic
    // build, tma_cost auto_twog4) keeps G = 4 there.
#ifdef RESOLVER_TWO_G4
    constexpr bool g2 = false;
#else
    constexpr bool g2 = RANK && NT <= 512;
#endif
    auto pass1_range = [&](int e_lo, int e_hi) {
        const int n = e_hi - e_lo;
        if (n <= NT) pass1_rows(Groups<1>{}, e_lo, e_hi);
        else if (n <= 2 * NT || UL < 4 || g2) pass1_rows(Groups<2>{}, e_lo, e_hi);
        else pass1_rows(Groups<4>{}, e_lo, e_hi);
    };
    // one call site: the pass's code once in the kernel; k > 0 (the wrapper launches the
    // _q kernels only then, resolver.py query_kernels: else the second round's e_lo is 0)
    bool same = false;
    for (int e_lo = 0, e_hi = ask ? k : Kk;; e_lo = k, e_hi = Kk) {
        pass1_range(e_lo, e_hi);
        if (!ask || e_lo > 0 || (same = same_queries(s_b, visible + (i64)b * K, K, k))) break;  // syncs
    }
    const int Ke = same ? k : Kk;
    const unsigned rep = same ? (unsigned)K : 1u;
    block_add(&cnt[0], n_tail * rep);
    block_add(&cnt[1], n_opt * rep);
    block_add(&cnt[2], n_hot * rep);
    block_add(&cnt[3], n_host * rep);
    if (same)  // identical queries: pass 1 checked the first's bound
        for (int j = 1 + threadIdx.x; j < K; j += NT) {
            const i64 v = visible[(i64)b * K + j];
            if (v < 0 || v > tail_hi) status |= ST_VISIBLE;
        }
    if (status) atomicOr(&cnt[6], status);
    __syncthreads();
    TRACE(1);  // pass 1 done

    unsigned m = 0, nv = 0, u_miss = 0;  // u_miss: distinct rows without a hot slot
    bool published = false;  // S_EARLY written (block-uniform)
    const unsigned hot_entries = cnt[2], host_entries = cnt[3];
    if (host_entries > 0 && B == 0) {
        // no hot cache: refused; S_U still counts the rows (the drop-in names the request)
        u_miss = bitmap_prefix(miss_bm, miss_pre, Wp, tmp);  // syncs
        if (threadIdx.x == 0) atomicOr(&cnt[6], (unsigned)ST_NOT_RESIDENT);
    } else if (hot_entries + host_entries > 0) {
        // hit slots go out as a mask (word s / 32: slots 32 (s / 32) ..; the commit stamps
        // them with coalesced stores), counted for the summary
        unsigned n_slots = 0;
        for (int w = threadIdx.x; w < (B + 31) >> 5; w += NT) {
            const unsigned v = hit_bm[w];
            hit_mask[(i64)b * B + w] = (i32)v;
            n_slots += __popc(v);
        }
        block_add(&cnt[4], n_slots);
        TRACE(3);  // hit mask out
        if (host_entries > 0) {
            const MissPath mp = miss_path<UL>(row, s_b, l_b, misses, victims, summary, b, Kk, Ke, B, Bp, W,
                                              finished_epoch, select_mode, sums, call, tmp, &cnt[5]);
            m = u_miss = mp.m, nv = mp.nv, published = mp.published;
        }
    }
    __syncthreads();
    TRACE(6);  // misses listed, victims chosen
    if (same) {  // identical queries: the first's final locations to the others'
        for (int i0 = threadIdx.x; i0 < k; i0 += 2 * NT) {
            i64 v[2];
#pragma unroll
            for (int q = 0; q < 2; ++q) v[q] = i0 + q * NT < k ? l_b[i0 + q * NT] : 0;
            for (int j = 1; j < K; ++j)
#pragma unroll
                for (int q = 0; q < 2; ++q)
                    if (i0 + q * NT < k) l_b[(i64)j * k + i0 + q * NT] = v[q];
        }
    }
    if (threadIdx.x == 0) {
        i64* sm = summary + (i64)b * SCOLS;
        const unsigned u = cnt[4] + u_miss;  // distinct rows of steps 2-3: hit slots + the rest
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
        if (!sums) {  // the batch's pending work, for the commit's no-copy shortcut
            unsigned long long* pend = reinterpret_cast<unsigned long long*>(totals + R_PEND + 2 * parity);
            if (m) atomicAdd(pend + P_COPIES, (unsigned long long)m);  // staged rows are misses
            if (cnt[6]) atomicOr(pend + P_STATUS, (unsigned long long)cnt[6]);
            // m = 0 here (a request with misses published above): no data to order, no fence
            if (call && !published) *reinterpret_cast<volatile i64*>(sm + S_EARLY) = (i64)call << 32 | m;
        }
        if (sums) {
            __threadfence();
            const unsigned long long t = atomicAdd(reinterpret_cast<unsigned long long*>(&totals[R_TICKET]), 1ull);
            last = (t == (unsigned long long)(batch - 1));
        }
    }
    if (!sums) {  // the commit launch sums the summaries (sum_batch): no ticket, no last block
        TRACE(7);
        return;
    }
    __syncthreads();
    TRACE(7);  // summary written, ticket taken
    if (!last) return;
    // last block: offsets and totals over the batch, then reset the ticket (the other blocks'
    // summaries are visible in L2 after their fence and ticket)
    TRACE_ANY(24);
    __threadfence();
    sum_batch(summary, totals, batch, 0x7FFFFFFFFFFFFFFFll, true, nullptr, nullptr, nullptr, tmp, cnt);  // syncs
    if (threadIdx.x == 0) totals[R_TICKET] = 0;
    TRACE_ANY(25);
}

#define LOOKUP_ARGS                                                                                     \
    const i64 *__restrict__ table, const i64 *__restrict__ sel, const i64 *__restrict__ visible,            \
        i64 *__restrict__ locs, i64 *__restrict__ miss_dst, i64 *__restrict__ misses,                       \
        i32 *__restrict__ victims, i32 *__restrict__ hit_mask, i64 *__restrict__ summary,                  \
        i64 *__restrict__ totals, int batch, int K, int k, int B, int Bp, int T, int p, int W,             \
        i64 finished_epoch, int select_mode, int sums, int parity, int call
#define LOOKUP_PASS table, sel, visible, locs, miss_dst, misses, victims, hit_mask, summary, totals, batch, K, \
                    k, B, Bp, T, p, W, finished_epoch, select_mode, sums, parity, call
// Four lookups a path (Q: the names' suffix, SAME: the identical-queries path): one block
// per SM (64 registers, 4 loads in flight per thread) or two (_2: a batch above the SM count
// in one wave; at NT = 1024 that leaves 32 registers, 2 loads in flight per thread; built
// with -DNT=512, 64 registers and 4 in flight, so a block keeps as many loads in flight as
// one 1024-thread block), each with hot hits by hot_index or by the rank form (_rank,
// resolver_rank.cuh).
#define LOOKUP_KERNELS(Q, SAME)                                                                         \
    extern "C" __global__ void __launch_bounds__(NT) resolve_lookup##Q(LOOKUP_ARGS) {                  \
        lookup_body<4, false, SAME>(LOOKUP_PASS);                                                        \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(NT, 2) resolve_lookup_2##Q(LOOKUP_ARGS) {             \
        lookup_body<(NT > 512 ? 2 : 4), false, SAME>(LOOKUP_PASS);                                       \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(NT) resolve_lookup_rank##Q(LOOKUP_ARGS) {             \
        lookup_body<4, true, SAME>(LOOKUP_PASS);                                                         \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(NT, 2) resolve_lookup_2_rank##Q(LOOKUP_ARGS) {        \
        lookup_body<(NT > 512 ? 2 : 4), true, SAME>(LOOKUP_PASS);                                        \
    }
LOOKUP_KERNELS(, false)
// The four again with the identical-queries path (same_queries), for calls with K > 1: in
// the kernels above it cost calls with K = 1 and no misses 0.8-1.4 us (H200, 96a73cb, run
// 91: registers, ptxas 16 / 60 bytes of spills), so K = 1 calls keep kernels without it.
LOOKUP_KERNELS(_q, true)
