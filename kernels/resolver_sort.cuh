#ifndef DHISPARSE_RESOLVER_SORT_CUH
#define DHISPARSE_RESOLVER_SORT_CUH
// Block-wide ascending sorts of (stamp << 20 | slot) keys in shared memory: the LRU order
// of the lookup's victims (resolver_lookup.cu) and of staging promotion
// (resolver_promote.cu). NT threads per block.
#include "resolver_common.cuh"

#define SORT_N (4 * NT)  // register bitonic sort size: 4 keys per thread (4096 at NT = 1024)

__device__ __forceinline__ unsigned long long bitonic_pick(unsigned long long mine, unsigned long long other,
                                                          int i, int j, int kk) {
    const bool asc = (i & kk) == 0, lower = (i & j) == 0;
    return lower == asc ? min(mine, other) : max(mine, other);
}

// Ascending sort of SORT_N keys in shared memory; thread t holds keys 4t..4t+3 in
// registers. Of the 78 bitonic stages, partners < 4 apart are in the same thread, < 128
// apart in the same warp (shuffles); only the 15 stages with partners >= 128 apart go
// through shared memory and a barrier. Already-sorted input (an empty or cold cache:
// stamps 0, slot order) returns after one check. Replaces a shared-memory bitonic sort
// (one barrier per stage) that cost ~45 us per request on the H200 (2%-miss, batch 1).
__device__ void sort_registers(unsigned long long* keys) {
    const int t = threadIdx.x;
    unsigned long long v[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) v[r] = keys[4 * t + r];
    bool ok = v[0] <= v[1] && v[1] <= v[2] && v[2] <= v[3] && (t == NT - 1 || v[3] <= keys[4 * t + 4]);
    if (__syncthreads_and(ok)) return;
    for (int kk = 2; kk <= SORT_N; kk <<= 1) {
        for (int j = kk >> 1; j > 0; j >>= 1) {
            if (j >= 128) {
                __syncthreads();
#pragma unroll
                for (int r = 0; r < 4; ++r) keys[4 * t + r] = v[r];
                __syncthreads();
#pragma unroll
                for (int r = 0; r < 4; ++r) v[r] = bitonic_pick(v[r], keys[(4 * t + r) ^ j], 4 * t + r, j, kk);
            } else if (j >= 4) {
#pragma unroll
                for (int r = 0; r < 4; ++r)
                    v[r] = bitonic_pick(v[r], __shfl_xor_sync(0xffffffffu, v[r], j >> 2), 4 * t + r, j, kk);
            } else if (j == 2) {
                const unsigned long long a0 = v[0], a1 = v[1], a2 = v[2], a3 = v[3];
                v[0] = bitonic_pick(a0, a2, 4 * t, 2, kk);
                v[2] = bitonic_pick(a2, a0, 4 * t + 2, 2, kk);
                v[1] = bitonic_pick(a1, a3, 4 * t + 1, 2, kk);
                v[3] = bitonic_pick(a3, a1, 4 * t + 3, 2, kk);
            } else {
                const unsigned long long a0 = v[0], a1 = v[1], a2 = v[2], a3 = v[3];
                v[0] = bitonic_pick(a0, a1, 4 * t, 1, kk);
                v[1] = bitonic_pick(a1, a0, 4 * t + 1, 1, kk);
                v[2] = bitonic_pick(a2, a3, 4 * t + 2, 1, kk);
                v[3] = bitonic_pick(a3, a2, 4 * t + 3, 1, kk);
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 4; ++r) keys[4 * t + r] = v[r];
    __syncthreads();
}

// Generic shared-memory bitonic sort of n (a power of two > SORT_N) keys.
__device__ void sort_smem(unsigned long long* keys, int n) {
    for (int kk = 2; kk <= n; kk <<= 1) {
        for (int j = kk >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += NT) {
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
}

#endif  // DHISPARSE_RESOLVER_SORT_CUH
