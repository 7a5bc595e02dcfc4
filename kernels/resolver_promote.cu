// Staging promotion (paper 3.4; services/decode/hierarchy/promotion.py): after a group's
// readers finished, the staged rows of one wave of acquisition blocks (one block per
// request, hot caches disjoint) move into LRU hot slots, all in ONE launch.
//
//   grid = blocks of the wave, NT threads; block b promotes rows[off[b] .. off[b+1]) of
//   request table row b, staged at epoch epochs[b] from arena rows locs[..].
//
// The definition (promotion._promote_one): rows in order; a row already held by a slot is
// skipped; otherwise it takes the first slot in (stamp, slot) order among the slots with
// stamp < epoch and stamp <= finished_epoch (not protected), whose stamp becomes the epoch (it leaves
// that set). So the eligible order E is fixed at the start and the j-th promoted row
// takes E[j]. Fast path (every resolve stages distinct misses): no staged row repeats and
// none is held -- found with two bitmaps over source rows -- so row i takes E[i] in
// parallel. Otherwise thread 0 walks the rows in order: row r is held iff it was promoted
// earlier in this block, or it sits in an original slot s that was not overwritten yet
// (s not eligible, or rank(s) in E >= promotions so far; of several holders, the one
// overwritten last decides). Then slots are rewritten and the
// payload rows of every layer are copied, arena row -> the slot's pool row; hot_index follows.
#include "resolver_common.cuh"
#include "resolver_sort.cuh"

#define SLOT_MASK 0xFFFFFull  // 20-bit slot in the low bits of a (stamp << 20 | slot) key
#define NO_RANK 0x7fffffff

// shared (dynamic): keys [Bp] u64, held bitmap [W] u32, seen bitmap [W] u32, rank [B] i32
template <int W>
__device__ __forceinline__ void promote_body(const i64* __restrict__ table, const i64* __restrict__ rows,
                                             const i64* __restrict__ locs, const i64* __restrict__ off,
                                             const i64* __restrict__ epochs, i32* __restrict__ slot_of,
                                             i64* __restrict__ promoted, const i64* __restrict__ payload_ptrs,
                                             int n_layers, unsigned row_bytes, int B, int Bp, int words,
                                             i64 finished_epoch) {
    extern __shared__ unsigned long long smem_keys[];
    unsigned long long* keys = smem_keys;
    unsigned* held_bm = reinterpret_cast<unsigned*>(keys + Bp);
    unsigned* seen_bm = held_bm + words;
    i32* rank = reinterpret_cast<i32*>(seen_bm + words);
    __shared__ unsigned s_cnt;
    __shared__ int s_j;

    const i64* row = table + (i64)blockIdx.x * TCOLS;
    i64* hot_rows = ptr<i64>(row, T_HOT_ROWS);
    i64* hot_stamp = ptr<i64>(row, T_HOT_STAMP);
    const i64* hot_locs = ptr<const i64>(row, T_HOT_LOCS);
    i64* hot_index = ptr<i64>(row, T_HOT_INDEX);
    const i64 tail_hi = row[T_TAIL_HI];
    const i64 lo = off[blockIdx.x], n = off[blockIdx.x + 1] - lo, epoch = epochs[blockIdx.x];
    const i64 nbits = (i64)words * 32;

    for (int w = threadIdx.x; w < words; w += NT) held_bm[w] = seen_bm[w] = 0u;
    if (threadIdx.x == 0) s_cnt = 0u;
    __syncthreads();
    unsigned n_elig = 0;
    for (int s = threadIdx.x; s < Bp; s += NT) {
        unsigned long long key = ~0ull;
        if (s < B) {
            const i64 r = hot_rows[s], st = hot_stamp[s];
            if (st < epoch && st <= finished_epoch) {
                key = ((unsigned long long)st << 20) | (unsigned)s;
                ++n_elig;
            }
            if (r >= 0 && r < nbits) atomicOr(&held_bm[r >> 5], 1u << (r & 31));
            rank[s] = NO_RANK;
        }
        keys[s] = key;
    }
    {
        unsigned v = n_elig;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if ((threadIdx.x & 31) == 0 && v) atomicAdd(&s_cnt, v);
    }
    __syncthreads();
    // the premise of the fast path: staged rows distinct, none held
    bool bad = false;
    for (i64 i = threadIdx.x; i < n; i += NT) {
        const i64 r = rows[lo + i];
        const unsigned bit = 1u << (r & 31);
        const unsigned old = atomicOr(&seen_bm[r >> 5], bit);
        bad |= (old & bit) || (held_bm[r >> 5] & bit);
    }
    bad = __syncthreads_or(bad);
    const int n_e = (int)s_cnt;
    if (Bp == SORT_N) sort_registers(keys);
    else sort_smem(keys, Bp);
    if (!bad) {
        const i64 m = min(n, (i64)n_e);
        for (i64 i = threadIdx.x; i < n; i += NT) slot_of[lo + i] = i < m ? (i32)(keys[i] & SLOT_MASK) : -1;
        if (threadIdx.x == 0) s_j = (int)m;
    } else {
        for (int i = threadIdx.x; i < n_e; i += NT) rank[keys[i] & SLOT_MASK] = i;
        __syncthreads();
        // the holder of each held staged row that is overwritten last: the one with the
        // largest rank in E (NO_RANK when not eligible). A row is held while any of its
        // holders is not overwritten yet, i.e. while that holder's rank >= promotions so
        // far. (Only one holder exists under invariant I4; the kernel stays exact without.)
        for (i64 i = threadIdx.x; i < n; i += NT) {
            const i64 r = rows[lo + i];
            i32 so = -1;
            if (test_bit(held_bm, r))
                for (int s = 0; s < B; ++s)
                    if (hot_rows[s] == r && (so < 0 || rank[s] > rank[so])) so = s;
            slot_of[lo + i] = so;
        }
        for (int w = threadIdx.x; w < words; w += NT) seen_bm[w] = 0u;  // now: promoted rows
        __syncthreads();
        if (threadIdx.x == 0) {
            int j = 0;
            for (i64 i = 0; i < n; ++i) {
                const i64 r = rows[lo + i];
                const i32 so = slot_of[lo + i];
                const bool held = test_bit(seen_bm, r) || (so >= 0 && rank[so] >= j);
                if (!held && j < n_e) {
                    slot_of[lo + i] = (i32)(keys[j++] & SLOT_MASK);
                    seen_bm[r >> 5] |= 1u << (r & 31);
                } else {
                    slot_of[lo + i] = -1;
                }
            }
            s_j = j;
        }
    }
    __syncthreads();
    // hot_index: the overwritten slots' rows leave it, then (after a barrier: a promoted row
    // may be one an overwritten slot held) the promoted rows enter; rows past tail_hi are
    // not committed and have no entry (only a state broken by hand holds them)
    for (i64 i = threadIdx.x; i < n; i += NT) {
        const i32 s = slot_of[lo + i];
        const i64 old = s >= 0 ? hot_rows[s] : -1;
        if (old >= 0 && old < tail_hi) hot_index[old] = -1;
    }
    __syncthreads();
    for (i64 i = threadIdx.x; i < n; i += NT) {
        const i32 s = slot_of[lo + i];
        if (s >= 0) {
            const i64 r = rows[lo + i];
            if (r < tail_hi) hot_index[r] = hot_locs[s] << HOT_SLOT_BITS | s;
            hot_rows[s] = r;
            hot_stamp[s] = epoch;
        }
    }
    if (threadIdx.x == 0) promoted[blockIdx.x] = s_j;
    // hot_rows changed only where a row was promoted: then the rank form's cache is stale
    if (threadIdx.x == 0 && s_j > 0) ptr<i64>(row, T_HOT_RANK)[RANK_VERSION] += 1;
    // payload rows of every layer: arena row -> the slot's pool row, W-byte vectors
    using V = typename Vec<W>::T;
    const unsigned vpr = row_bytes / W;
    const i64 items = (i64)n_layers * n * vpr;
    for (i64 it = threadIdx.x; it < items; it += NT) {
        const i64 li = it / vpr, layer = li / n, i = li - layer * n;
        const unsigned c = (unsigned)(it - li * vpr);
        const i32 s = slot_of[lo + i];
        if (s < 0) continue;
        char* base = reinterpret_cast<char*>(payload_ptrs[layer]);
        *reinterpret_cast<V*>(base + hot_locs[s] * row_bytes + (i64)c * W) =
            *reinterpret_cast<const V*>(base + locs[lo + i] * row_bytes + (i64)c * W);
    }
}

#define PROMOTE(W)                                                                                         \
    extern "C" __global__ void __launch_bounds__(NT) promote_staged_##W(                                    \
        const i64* table, const i64* rows, const i64* locs, const i64* off, const i64* epochs, i32* slot_of, \
        i64* promoted, const i64* payload_ptrs, int n_layers, unsigned row_bytes, int B, int Bp, int words, \
        i64 finished_epoch) {                                                                                \
        promote_body<W>(table, rows, locs, off, epochs, slot_of, promoted, payload_ptrs, n_layers, row_bytes, \
                        B, Bp, words, finished_epoch);                                                       \
    }
PROMOTE(16)
PROMOTE(8)
PROMOTE(4)
