#ifndef DHISPARSE_RESOLVER_RANK_CUH
#define DHISPARSE_RESOLVER_RANK_CUH
// The lookup's rank form of the hot hits (kernels/resolver.py lookup(hits="rank")): instead
// of one random hot_index load per selected row (a 32-byte sector of an 8-byte-per-row
// array: 2048 per request, the floor of a full GPU), the block holds in shared memory a
// bitmap of the rows its hot slots hold, the bitmap's per-word prefix of set bits and the
// held rows' hot_index entries in ascending row order; a selected row is held when its bit
// is set, and its entry is the one at its rank among the held rows (prefix + popcount).
// The three come from the request's hot_rank cache (request.py): read as they are when the
// cache is valid (built at the current RANK_VERSION, which every writer of hot_rows bumps),
// else built from hot_rows / hot_locs (coalesced) and written back for the calls after.
// The prefix is cached since run 125 (H200, abb95da, call by call: batch 160 without misses
// 20.7-21.0 us against 20.8-21.4 with the scan, though run 124's trace had put 1.5-1.7 us
// between the cache's loads and the scan's end).
#include "resolver_common.cuh"

// The cache's loads: its address comes from the table, so the compiler loads it through
// generic addresses; as global loads through L2 only (ld.global.cg: read once, into shared
// memory) batch 160 without misses took 19.7-19.9 us against 20.2-20.4 (656 B) and
// 20.0-20.2 against 20.3-20.6 (1152 B), 2% misses within their spread; global loads that
// keep their L1 line read alike, L2-only loads of pass 1's selection gained nothing (H200,
// c94524c and 20b0ca9, runs 137-138, call by call); against this build's generic loads
// (RESOLVER_RANK_GENERIC, a diagnostic build, tma_cost auto_rankgeneric) 20.0-20.2 against
// 20.2-20.6 and 19.8-20.1 against 20.0-20.5 (run 139). Global loads of pass 1's loads through
// the table's pointers (page flags and map, hot_index, tail locations) gained nothing there
// (batch 1 and 32 within 0.3 us either way) and were not kept.
#ifdef RESOLVER_RANK_GENERIC
#define RANK_LD(p) (*(p))
#else
#define RANK_LD(p) __ldcg(p)
#endif

// Fills held_bm [Wp] (rows [0, 32 W)), held_pre [Wp] and ent [B] (entries by rank) for the
// request of `row`; rk: its hot_rank cache, cap = the cache's bitmap words (table columns
// T_HOT_RANK and T_RANK_CAP, loaded by the caller with the row's other columns). Every
// thread calls it; ends with a barrier. Held rows < 65536 (u16 prefix; the wrapper keeps B
// below).
__device__ void rank_cache(const i64* row, i64* rk, int B, int W, int Wp, i64 cap, unsigned* held_bm,
                           u16* held_pre, unsigned long long* ent, unsigned* tmp) {
    i64* cent = rk + RANK_HEAD;                                  // [B rounded up to even]
    unsigned* cbits = reinterpret_cast<unsigned*>(cent + ((B + 1) & ~1));  // [cap], 16-byte aligned
    u16* cpre = reinterpret_cast<u16*>(cbits + cap);  // [cap], the bitmap's prefix, 16-byte aligned
    const int Wl = (int)min((i64)Wp, cap);  // words the cache holds of this call's bitmap
    // header, entries, bitmap and prefix loaded together (all but the header are used only
    // if it says the cache is valid): one round trip on the common path
    const i64 version = rk[RANK_VERSION], built = rk[RANK_BUILT], covered = rk[RANK_WORDS];
    {
        // entries in pairs and bitmap words in fours (16 bytes a load), their prefix in fours
        // (8 bytes), in one index space with every load of a round issued before the first
        // store (one round for B = 4096 and 100K rows: 2048 + 782 + 782 loads). ent is only
        // 8-byte aligned: a pair goes into it as two 8-byte stores. ent[B] may be written (B
        // odd): Bp > B. Before (8-byte entry loads, then the bitmap's, then the table's
        // columns after the fills: three dependent round trips) batch 160 took 0.6-1.3 us
        // more without misses and 14-78 us more at 20% misses for 656 B rows (H200, 6a30582,
        // run 86, call by call).
        constexpr int R = NT >= 1024 ? 4 : 8;
        const uint4* e4 = reinterpret_cast<const uint4*>(cent);
        const uint4* c4 = reinterpret_cast<const uint4*>(cbits);
        const uint2* p2 = reinterpret_cast<const uint2*>(cpre);
        uint2* e2 = reinterpret_cast<uint2*>(ent);
        uint4* d4 = reinterpret_cast<uint4*>(held_bm);
        uint2* dp2 = reinterpret_cast<uint2*>(held_pre);
        const int ge = (B + 1) >> 1, g = Wp >> 2, gl = Wl >> 2, gb = ge + g, n = gb + g;  // Wp, cap: x4
        for (int i0 = threadIdx.x; i0 < n; i0 += R * NT) {
            uint4 v[R];
#pragma unroll
            for (int q = 0; q < R; ++q) {
                const int i = i0 + q * NT;
                v[q] = make_uint4(0u, 0u, 0u, 0u);
                if (i < ge) {
                    v[q] = RANK_LD(e4 + i);
                } else if (i < gb) {
                    if (i - ge < gl) v[q] = RANK_LD(c4 + (i - ge));
                } else if (i < n && i - gb < gl) {
                    const uint2 t = RANK_LD(p2 + (i - gb));
                    v[q].x = t.x, v[q].y = t.y;
                }
            }
#pragma unroll
            for (int q = 0; q < R; ++q) {
                const int i = i0 + q * NT;
                if (i < ge) {
                    e2[2 * i] = make_uint2(v[q].x, v[q].y);
                    e2[2 * i + 1] = make_uint2(v[q].z, v[q].w);
                } else if (i < gb) {
                    d4[i - ge] = v[q];
                } else if (i < n) {
                    dp2[i - gb] = make_uint2(v[q].x, v[q].y);
                }
            }
        }
    }
    TRACE(14);  // thread 0's loads of the cache arrived
    const int Wc = (int)min((i64)W, cap);
    if (built == version && covered >= Wc) {  // block-uniform
        __syncthreads();
        TRACE(15);  // every thread's (the prefix came with the bitmap: no scan)
        return;
    }
    // build: the held rows below 32 W into the bitmap, then each one's entry at its rank
    const i64* hot_rows = ptr<const i64>(row, T_HOT_ROWS);
    const i64* hot_locs = ptr<const i64>(row, T_HOT_LOCS);
    __syncthreads();
    bitmap_fill(held_bm, nullptr, Wp);
    __syncthreads();
    const i64 nbits = (i64)W * 32;
    for (int s0 = threadIdx.x; s0 < B; s0 += 4 * NT) {
        i64 r[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int s = s0 + q * NT;
            r[q] = s < B ? hot_rows[s] : -1;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
            if (r[q] >= 0 && r[q] < nbits) atomicOr(&held_bm[r[q] >> 5], 1u << (r[q] & 31));
    }
    __syncthreads();
    const unsigned held = bitmap_prefix(held_bm, held_pre, Wp, tmp);  // syncs
    for (int s0 = threadIdx.x; s0 < B; s0 += 4 * NT) {
        i64 r[4], l[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int s = s0 + q * NT;
            r[q] = s < B ? hot_rows[s] : -1;
            l[q] = s < B ? hot_locs[s] : 0;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int s = s0 + q * NT;
            if (r[q] >= 0 && r[q] < nbits)
                ent[rank_of(held_bm, held_pre, r[q])] = (unsigned long long)(l[q] << HOT_SLOT_BITS | s);
        }
    }
    __syncthreads();
    // write back for the calls after: entries, bitmap and prefix words [0, Wc), then the
    // header (a later kernel sees all of it; this grid does not read the cache again)
    for (int i = threadIdx.x; i < (int)held; i += NT) cent[i] = (i64)ent[i];
    for (int w = threadIdx.x; w < Wc; w += NT) cbits[w] = held_bm[w], cpre[w] = held_pre[w];
    if (threadIdx.x == 0) rk[RANK_WORDS] = Wc, rk[RANK_BUILT] = version;
}

// The held row's hot_index entry, or -1 (row < 32 W).
template <typename Row>
__device__ __forceinline__ i64 rank_entry(const unsigned* held_bm, const u16* held_pre,
                                          const unsigned long long* ent, Row r) {
    return test_bit(held_bm, r) ? (i64)ent[rank_of(held_bm, held_pre, r)] : -1;
}

#endif
