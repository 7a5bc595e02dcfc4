// Launch 1 of the fused resolver (see resolver_common.cuh): direct path, union bitmap,
// hot hits by the row -> slot index, LRU victims, per-request summaries and the batch totals.
#include "resolver_common.cuh"
#include "resolver_sort.cuh"
#include "resolver_rank.cuh"

#define SELECT_MAX 1024  // victims chosen by radix select up to this many (else by a sort)

// The nv-th smallest K* of Bp unique keys (non-candidates are ~0), without sorting them:
// MSD radix select with 8-bit histograms over the bytes in which candidate keys differ
// (kor / kand: OR and AND of every candidate key; a byte they agree on is every
// candidate's, so its pass is skipped: stamps and 20-bit slots leave several such bytes),
// stopping at the first byte whose chosen bin holds exactly the keys still needed (then K*
// is that bin's largest possible key). The victims are the candidates with keys <= K*.
// Histogram counts are warp-aggregated with match (select_mode 1, "radix_match"), else
// one shared atomic per key (select_mode 2, "radix": faster on the H200). Block-uniform
// result; ends with a barrier.
__device__ unsigned long long select_kstar(const unsigned long long* keys, int Bp, unsigned nv, unsigned* hist,
                                           unsigned* scal, unsigned long long kor, unsigned long long kand,
                                           bool match) {
    const int lane = threadIdx.x & 31;
    const unsigned long long vary = kor ^ kand;
    unsigned long long mask = 0;  // bytes decided so far ...
    for (int byte = 0; byte < 8; ++byte)
        if (!((vary >> (8 * byte)) & 255ull)) mask |= 255ull << (8 * byte);
    unsigned long long prefix = kand & mask;  // ... and their values
    TRACE(10);  // select: constant bytes
    unsigned target = nv;  // 1-based rank of K* among the keys matching prefix
    for (int shift = 56; shift >= 0; shift -= 8) {
        if ((mask >> shift) & 255ull) continue;  // block-uniform: a byte every candidate shares
        for (int i = threadIdx.x; i < 256; i += NT) hist[i] = 0;
        __syncthreads();
        for (int s0 = 0; s0 < Bp; s0 += NT) {  // uniform trip count: every lane reaches the ballot
            const int s = s0 + threadIdx.x;
            const unsigned long long key = s < Bp ? keys[s] : ~0ull;
            const bool in = key != ~0ull && (key & mask) == prefix;
            const unsigned bin = (unsigned)(key >> shift) & 255u, act = __ballot_sync(0xffffffffu, in);
            if (in && match) {
                const unsigned peers = __match_any_sync(act, bin);
                if (lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
            } else if (in) {
                atomicAdd(&hist[bin], 1u);
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            unsigned c[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) sum += (c[j] = hist[lane * 8 + j]);
            unsigned incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned y = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += y;
            }
            unsigned run = incl - sum;
            if (run < target && target <= incl) {
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    if (run < target && target <= run + c[j]) {
                        scal[0] = lane * 8 + j;
                        scal[1] = target - run;
                        scal[3] = c[j];
                    }
                    run += c[j];
                }
            }
        }
        __syncthreads();
        prefix |= (unsigned long long)scal[0] << shift;
        mask |= 255ull << shift;
        target = scal[1];
        const bool whole_bin = scal[1] == scal[3];  // every key of the bin is taken
        __syncthreads();
        if (whole_bin) break;
    }
    TRACE(11);  // select: radix passes
    return prefix | ~mask;  // = prefix once every byte is decided
}

// The victims' slot bitmap (Bp / 32 words at vbm, keys indexed by slot: bit s set where
// keys[s] is a candidate's key <= kstar), one ballot per warp and word. Every thread calls it.
__device__ __forceinline__ void victim_bits(const unsigned long long* keys, int Bp, unsigned long long kstar,
                                            unsigned* vbm) {
    for (int s = threadIdx.x; s < Bp; s += NT) {  // Bp, NT: multiples of 32 (whole words)
        const unsigned long long key = keys[s];
        const unsigned word = __ballot_sync(0xffffffffu, key != ~0ull && key <= kstar);
        if (!(threadIdx.x & 31)) vbm[s >> 5] = word;
    }
}

// The set bits of bitmap word w in ascending order, as w * 32 + bit, into out from i;
// returns the next i.
template <typename T>
__device__ __forceinline__ unsigned list_word(unsigned bits, int w, T* __restrict__ out, unsigned i) {
    while (bits) {
        const int bit = __ffs(bits) - 1;
        bits &= bits - 1;
        out[i++] = (T)w * 32 + bit;
    }
    return i;
}

// The set bits of bm [0, Hp) in ascending order into out (the victims in slot order);
// thread t lists a contiguous chunk of words. Every thread calls it (block_scan syncs).
__device__ __forceinline__ void list_bits(const unsigned* bm, int Hp, i32* __restrict__ out, unsigned* tmp) {
    const int chunk = (Hp + NT - 1) / NT, lo = threadIdx.x * chunk, hi = min(Hp, lo + chunk);
    unsigned c = 0;
    for (int w = lo; w < hi; ++w) c += __popc(bm[w]);
    unsigned total;
    unsigned i = block_scan(c, tmp, &total);
    for (int w = lo; w < hi; ++w) i = list_word(bm[w], w, out, i);
}

// The lookup's miss path, for a request with host misses (every thread of the block calls
// it, after pass 1): the misses' prefix, pass 2 (a miss entry's location becomes its encoded
// rank among the misses), the misses listed in ascending row order (published for the
// commit's preload on the sync-free path), the LRU keys of the candidate slots and the
// victims (the nv first in LRU order, listed in slot order). Returns the distinct misses m,
// the victims nv and whether S_EARLY went out. Ke: the entries looked up (Kk, or the first
// query's k when the queries are identical); Kk: the misses' row stride. tmp: the lookup's
// scan scratch; n_cand: its
// candidate count (0 on entry). Out of line it gained nothing measurable (H200, 14ec96c,
// run 66), so it is inlined.
struct MissPath {
    unsigned m, nv;
    bool published;
};
template <int UL>
__device__ __forceinline__ MissPath miss_path(const i64* __restrict__ row, const i64* __restrict__ s_b,
                                        i64* __restrict__ l_b, i64* __restrict__ misses,
                                        i32* __restrict__ victims, i64* __restrict__ summary, int b, int Kk, int Ke,
                                        int B, int Bp, int W, i64 finished_epoch, int select_mode, int sums,
                                        int call, unsigned* tmp, unsigned* n_cand) {
    extern __shared__ __align__(16) unsigned char smem[];  // lookup_body's layout
    __shared__ unsigned kbits[4];  // OR (lo, hi) and AND (lo, hi) of the candidate LRU keys
    __shared__ unsigned hist[256], scal[4];
    const int Wp = (W + 3) & ~3, Hp = Bp >> 5;
    unsigned* miss_bm = reinterpret_cast<unsigned*>(smem);
    unsigned* hit_bm = miss_bm + Wp;  // the victims' slot bitmap once the LRU keys are built
    u16* miss_pre = reinterpret_cast<u16*>(miss_bm + Wp + Hp);
    unsigned long long* keys = reinterpret_cast<unsigned long long*>(smem + (size_t)6 * Wp + (size_t)4 * Hp);
    if (threadIdx.x < 4) kbits[threadIdx.x] = threadIdx.x < 2 ? 0u : ~0u;  // before bitmap_prefix's barriers
    bool published = false;  // S_EARLY written (block-uniform)
    const unsigned m = bitmap_prefix(miss_bm, miss_pre, Wp, tmp);  // syncs
    TRACE(4);  // miss prefix
    // pass 2: a miss entry gets its encoded rank among the misses
    auto pass2 = [&](auto groups) {
        constexpr int G = decltype(groups)::value;
        for (int e0 = threadIdx.x; e0 < Ke; e0 += NT * G) {
            i64 l[G], r[G];
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const int e = e0 + q * NT;
                l[q] = e < Ke ? l_b[e] : -1;
                r[q] = e < Ke ? s_b[e] : -1;
            }
#pragma unroll
            for (int q = 0; q < G; ++q)
                if (l[q] == SENTINEL) l_b[e0 + q * NT] = -2 - (i64)rank_of(miss_bm, miss_pre, r[q]);
        }
    };
    if (Ke <= NT) pass2(Groups<1>{});
    else if (Ke <= 2 * NT || UL < 4) pass2(Groups<2>{});
    else pass2(Groups<4>{});
    TRACE(5);  // pass 2 (thread 0's share)
    // misses in ascending row order
    const int chunk = (W + NT - 1) / NT, lo = threadIdx.x * chunk, hi = min(W, lo + chunk);
    for (int w = lo; w < hi; ++w) list_word(miss_bm[w], w, misses + (i64)b * Kk, miss_pre[w]);
    // step 3: candidates = unprotected non-hit slots, keyed (stamp, slot); then the
    // nv first in LRU order, (stamp, slot) ascending. Every key of [0, Bp) is
    // written (~0 = not a candidate).
    TRACE(8);  // misses listed (thread 0's share)
    if (!sums && call) {  // the commit's copy blocks may read these misses now
        // the barrier orders every thread's misses stores before thread 0's release
        // (cumulative), as a grid barrier's arrival does
        __syncthreads();
        if (threadIdx.x == 0) st_release(summary + (i64)b * SCOLS + S_EARLY, (i64)call << 32 | m);
        published = true;
    }
    const i64* stamp = ptr<const i64>(row, T_HOT_STAMP);
    const i64* protect = ptr<const i64>(row, T_HOT_PROTECT);
    unsigned n_cands = 0;
    unsigned long long kor = 0, kand = ~0ull;
    for (int s0 = threadIdx.x; s0 < Bp; s0 += NT * UL) {
        i64 pr[UL], st[UL];
        bool pend[UL];
#pragma unroll
        for (int q = 0; q < UL; ++q) {
            const int s = s0 + q * NT;
            pend[q] = s < B && !test_bit(hit_bm, s);
            pr[q] = pend[q] ? protect[s] : 0;
            st[q] = pend[q] ? stamp[s] : 0;
        }
#pragma unroll
        for (int q = 0; q < UL; ++q) {
            const int s = s0 + q * NT;
            const bool cand = pend[q] && pr[q] <= finished_epoch;
            const unsigned long long key = ((unsigned long long)st[q] << 20) | (unsigned)s;
            keys[s] = cand ? key : ~0ull;
            n_cands += cand;
            if (cand) kor |= key, kand &= key;
        }
    }
    block_add(n_cand, n_cands);
    if (select_mode >= 1) {  // the radix select's constant bytes: one redux per half-word
        const unsigned o_lo = __reduce_or_sync(0xffffffffu, (unsigned)kor);
        const unsigned o_hi = __reduce_or_sync(0xffffffffu, (unsigned)(kor >> 32));
        const unsigned a_lo = __reduce_and_sync(0xffffffffu, (unsigned)kand);
        const unsigned a_hi = __reduce_and_sync(0xffffffffu, (unsigned)(kand >> 32));
        if ((threadIdx.x & 31) == 0) {
            atomicOr(&kbits[0], o_lo), atomicOr(&kbits[1], o_hi);
            atomicAnd(&kbits[2], a_lo), atomicAnd(&kbits[3], a_hi);
        }
    }
    __syncthreads();
    TRACE(9);  // LRU keys built
    // the victims: the nv candidates first in LRU order ((stamp, slot) ascending), taken by
    // the misses (ascending rows) in slot order; the hit bitmap (read above) holds them
    const unsigned nc = *n_cand, nv = min(m, nc);
    if (nv == 0) {
    } else if (nv == nc) {  // every candidate (cold calls): no order needed
        victim_bits(keys, Bp, ~0ull - 1, hit_bm);
    } else if (select_mode >= 1 && nv <= SELECT_MAX) {
        victim_bits(keys, Bp,
                    select_kstar(keys, Bp, nv, hist, scal, ((unsigned long long)kbits[1] << 32) | kbits[0],
                                 ((unsigned long long)kbits[3] << 32) | kbits[2], select_mode == 1),
                    hit_bm);
    } else {
        for (int i = threadIdx.x; i < Hp; i += NT) hit_bm[i] = 0u;
        // keys already in order (an empty or cold cache; non-candidates' ~0 keys last): the
        // candidates are slots 0 .. nc - 1, the victims 0 .. nv - 1, in slot order
        if (Bp == SORT_N && sort_registers(keys)) {  // block-uniform
            for (int i = threadIdx.x; i < (int)nv; i += NT) victims[(i64)b * B + i] = i;
            TRACE(12);
            return MissPath{m, nv, published};
        }
        if (Bp != SORT_N) sort_smem(keys, Bp);
        __syncthreads();
        // the first nv in LRU order into the bitmap, one OR per warp and word (sorted keys
        // of a cold cache have ascending slots: a shared atomic per key made cold calls at
        // batch 1 3-6 us slower, H200, runs 74-80)
        for (int i0 = 0; i0 < (int)nv; i0 += NT) {  // uniform trip count: whole warps
            const int i = i0 + threadIdx.x;
            const bool in = i < (int)nv;
            const unsigned s = in ? (unsigned)(keys[i] & 0xFFFFFull) : 0u, act = __ballot_sync(0xffffffffu, in);
            if (in) {
                const unsigned peers = __match_any_sync(act, s >> 5);
                const unsigned bits = __reduce_or_sync(peers, 1u << (s & 31));
                if ((threadIdx.x & 31) == __ffs(peers) - 1) atomicOr(&hit_bm[s >> 5], bits);
            }
        }
    }
    __syncthreads();
    if (nv) list_bits(hit_bm, Hp, victims + (i64)b * B, tmp);
    TRACE(12);  // victims listed
    return MissPath{m, nv, published};
}

// Whether every query of a request selects the first's rows with a visible bound no lower
// than the first's (s_b: the request's K x k selections, vis_b: its K bounds): the round's K
// queries sharing one selection, under causal bounds (eq. 5: they grow with the query). Then
// an entry of any query is valid exactly where the first query's is on a call without bad
// entries, and flagged where it is on one with them (a row at or past a later query's bound
// is past the first's). The loads of up to 4 queries go out before the first comparison.
// Every thread calls it; block-uniform result.
__device__ __forceinline__ bool same_queries(const i64* __restrict__ s_b, const i64* __restrict__ vis_b, int K,
                                             int k) {
    bool diff = false;
    for (int j = threadIdx.x; j < K; j += NT) diff |= vis_b[j] < vis_b[0];
    for (int i0 = threadIdx.x; i0 < k; i0 += 2 * NT) {
        i64 f[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) f[q] = i0 + q * NT < k ? s_b[i0 + q * NT] : 0;
#pragma unroll 4
        for (int j = 1; j < K; ++j)
#pragma unroll
            for (int q = 0; q < 2; ++q)
                if (i0 + q * NT < k) diff |= s_b[(i64)j * k + i0 + q * NT] != f[q];
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
    const i64 tail_lo = row[T_TAIL_LO], tail_hi = row[T_TAIL_HI];
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
    // the round's K queries sharing one selection (same_queries): passes 1 and 2 take the
    // first query's Ke = k entries, its locations go to the others' at the end and the entry
    // counters count every query's; the others' bounds are checked apart (ST_VISIBLE).
    // Only in the _q kernels (SAME), which the wrapper launches for K > 1. With every entry
    // looked up K = 8 identical selections cost 1.003-1.04x K = 1 (runs 82-89); with this
    // path 1.01x (run 90, in every kernel then)
    const int Kq = SAME && K > 1 && same_queries(s_b, visible + (i64)b * K, K, k) ? 1 : K, Ke = Kq * k;

    if (rank) {  // into L2 while the block reads its cache: what pass 1 loads after it (the
        // selection, and the page map and flags of the pages below the tail)
        const int pages = (int)((tail_lo + p - 1) / p);
        for (int i = threadIdx.x; i * 16 < Kk; i += NT) prefetch_l2(s_b + i * 16);
        for (int i = threadIdx.x; i * 16 < pages; i += NT) prefetch_l2(page_map + i * 16);
        for (int i = threadIdx.x; i * 128 < pages; i += NT) prefetch_l2(page_ready + i * 128);
    }
    bitmap_fill(miss_bm, nullptr, Wp + Hp);
    if (threadIdx.x < 8) cnt[threadIdx.x] = 0u;
    if (rank) rank_cache(row, rank_at, B, W, Wp, rank_cap, held_bm, held_pre, keys, tmp);  // syncs
    __syncthreads();
    TRACE(2);  // the rank form's cache in shared memory

    // pass 1: direct path, then hot hits by the request's row -> slot index (one load
    // beside the page loads: hot_index packs the slot's pool row, so a hit's location
    // needs no further load); the misses become the union bitmap, hit slots a bitmap.
    // Entries go in groups of G per thread with every load of a group issued before the
    // first use (after the L2 flush each dependent load is an HBM round trip; batching
    // keeps G of them in flight). Row arithmetic is 32-bit when every row of the request
    // fits (64-bit division is a long instruction sequence on the GPU).
    const bool small = tail_hi <= 0x7FFFFFFFll;
    const i64 vis1 = SAME ? (Kq == 1 ? visible[(i64)b * K] : 0) : K == 1 ? visible[b] : 0;
    unsigned n_tail = 0, n_opt = 0, n_hot = 0, n_host = 0, status = 0;
    auto pass1 = [&](auto groups) {
        constexpr int G = decltype(groups)::value;
        for (int e0 = threadIdx.x; e0 < Ke; e0 += NT * G) {
            i64 r[G], vis[G], loc[G], pg[G], pm[G], hi[G];
            bool tail[G], page[G];
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const int e = e0 + q * NT;
                r[q] = e < Ke ? s_b[e] : -1;
                vis[q] = Kq == 1 ? vis1 : e < Ke ? visible[(i64)b * K + e / k] : 0;
            }
#pragma unroll
            for (int q = 0; q < G; ++q) {
                unsigned bad = 0;
                if (e0 + q * NT < Ke) {
                    if (vis[q] < 0 || vis[q] > tail_hi) bad |= ST_VISIBLE;
                    if (r[q] < -1) bad |= ST_SEL_LT_M1;
                    if (r[q] >= vis[q]) bad |= ST_SEL_GE_VISIBLE;
                }
                status |= bad;
                if (bad || r[q] < 0) r[q] = -1;  // a flagged entry reads no table (may be out of range)
                tail[q] = r[q] >= tail_lo && r[q] < tail_hi;
                i64 tl = 0;
                if (small) {
                    pg[q] = r[q] >= 0 ? (unsigned)r[q] / (unsigned)p : 0;
                    tl = tail[q] ? (unsigned)r[q] % (unsigned)T : 0;
                } else {
                    pg[q] = r[q] >= 0 ? r[q] / p : 0;
                    tl = tail[q] ? r[q] % T : 0;
                }
                // page_map and hot_index beside page_ready (all indexed by the row), not
                // after it: no dependent round trip; each is unused where it does not apply
                const bool rest = r[q] >= 0 && !tail[q];
                page[q] = rest && page_ready[pg[q]];
                pm[q] = rest ? page_map[pg[q]] : 0;
                if (RANK)
                    hi[q] = rest && rank && r[q] < nbits ? rank_entry(held_bm, held_pre, keys, r[q]) : -1;
                else
                    hi[q] = rest && B > 0 && r[q] < nbits ? hot_index[r[q]] : -1;
                loc[q] = tail[q] ? tail_locs[tl] : -1;
            }
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const int e = e0 + q * NT;
                if (page[q]) {
                    loc[q] = pm[q] * p + (r[q] - pg[q] * p);
                    ++n_opt;
                } else if (tail[q]) {
                    ++n_tail;
                } else if (r[q] >= 0) {
                    if (r[q] >= nbits) {
                        status |= ST_ROW_RANGE;
                    } else if (hi[q] >= 0) {
                        const unsigned s = (unsigned)(hi[q] & HOT_SLOT_MASK);
                        loc[q] = hi[q] >> HOT_SLOT_BITS;
                        atomicOr(&hit_bm[s >> 5], 1u << (s & 31));
                        ++n_hot;
                    } else {
                        loc[q] = SENTINEL;
                        atomicOr(&miss_bm[r[q] >> 5], 1u << (r[q] & 31));
                        ++n_host;
                    }
                }
                if (e < Ke) l_b[e] = loc[q];
            }
        }
    };
    if (Ke <= NT) pass1(Groups<1>{});
    else if (Ke <= 2 * NT || UL < 4) pass1(Groups<2>{});
    else pass1(Groups<4>{});
    const unsigned rep = Kq < K ? (unsigned)K : 1u;
    block_add(&cnt[0], n_tail * rep);
    block_add(&cnt[1], n_opt * rep);
    block_add(&cnt[2], n_hot * rep);
    block_add(&cnt[3], n_host * rep);
    if (Kq < K)  // identical queries: pass 1 checked the first's bound
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
    if (Kq < K) {  // identical queries: the first's final locations to the others'
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
// One block per SM (64 registers, 4 loads in flight per thread) ...
extern "C" __global__ void __launch_bounds__(NT) resolve_lookup(LOOKUP_ARGS) {
    lookup_body<4, false, false>(LOOKUP_PASS);
}
// ... or two: a batch above the SM count in one wave. At NT = 1024 that leaves 32 registers
// (2 loads in flight per thread); built with -DNT=512, 64 registers and 4 in flight, so a
// block keeps as many loads in flight as one 1024-thread block.
extern "C" __global__ void __launch_bounds__(NT, 2) resolve_lookup_2(LOOKUP_ARGS) {
    lookup_body<(NT > 512 ? 2 : 4), false, false>(LOOKUP_PASS);
}
// The same with the rank form of the hot hits (resolver_rank.cuh).
extern "C" __global__ void __launch_bounds__(NT) resolve_lookup_rank(LOOKUP_ARGS) {
    lookup_body<4, true, false>(LOOKUP_PASS);
}
extern "C" __global__ void __launch_bounds__(NT, 2) resolve_lookup_2_rank(LOOKUP_ARGS) {
    lookup_body<(NT > 512 ? 2 : 4), true, false>(LOOKUP_PASS);
}
// The four again with the identical-queries path (same_queries), for calls with K > 1: in
// the kernels above it cost calls with K = 1 and no misses 0.8-1.4 us (H200, 96a73cb, run
// 91: registers, ptxas 16 / 60 bytes of spills), so K = 1 calls keep kernels without it.
extern "C" __global__ void __launch_bounds__(NT) resolve_lookup_q(LOOKUP_ARGS) {
    lookup_body<4, false, true>(LOOKUP_PASS);
}
extern "C" __global__ void __launch_bounds__(NT, 2) resolve_lookup_2_q(LOOKUP_ARGS) {
    lookup_body<(NT > 512 ? 2 : 4), false, true>(LOOKUP_PASS);
}
extern "C" __global__ void __launch_bounds__(NT) resolve_lookup_rank_q(LOOKUP_ARGS) {
    lookup_body<4, true, true>(LOOKUP_PASS);
}
extern "C" __global__ void __launch_bounds__(NT, 2) resolve_lookup_2_rank_q(LOOKUP_ARGS) {
    lookup_body<(NT > 512 ? 2 : 4), true, true>(LOOKUP_PASS);
}
