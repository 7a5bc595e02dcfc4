#ifndef DHISPARSE_RESOLVER_VICTIMS_CUH
#define DHISPARSE_RESOLVER_VICTIMS_CUH
// The lookup's miss path (kernels/resolver_lookup.cu): the misses' prefix and ranks, the
// misses listed in row order, and the LRU victims among the unprotected slots (radix select
// of the nv-th key, or a sort), listed in slot order.
#include "resolver_common.cuh"
#include "resolver_sort.cuh"

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
    unsigned n_cands = 0;
    unsigned long long kor = 0, kand = ~0ull;
    for (int s0 = threadIdx.x; s0 < Bp; s0 += NT * UL) {
        i64 st[UL];
        bool pend[UL];
#pragma unroll
        for (int q = 0; q < UL; ++q) {
            const int s = s0 + q * NT;
            pend[q] = s < B && !test_bit(hit_bm, s);
            st[q] = pend[q] ? stamp[s] : 0;
        }
#pragma unroll
        for (int q = 0; q < UL; ++q) {
            const int s = s0 + q * NT;
            const bool cand = pend[q] && st[q] <= finished_epoch;  // unprotected
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

#endif
