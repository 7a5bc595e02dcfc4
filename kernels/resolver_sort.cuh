#ifndef DHISPARSE_RESOLVER_SORT_CUH
#define DHISPARSE_RESOLVER_SORT_CUH
// Block-wide ascending sorts of (stamp << 20 | slot) keys in shared memory: the LRU order
// of the lookup's victims (resolver_lookup.cu) and of staging promotion
// (resolver_promote.cu). NT threads per block.
#include "resolver_common.cuh"

#define SORT_N 4096  // register bitonic sort size
#define KPT (SORT_N / NT)  // keys per thread: 4 at 1024 threads, 8 at 512
static_assert(SORT_N % NT == 0 && KPT >= 2 && (KPT & (KPT - 1)) == 0, "KPT: a power of two >= 2");

__device__ __forceinline__ unsigned long long bitonic_pick(unsigned long long mine, unsigned long long other,
                                                          int i, int j, int kk) {
    const bool asc = (i & kk) == 0, lower = (i & j) == 0;
    return lower == asc ? min(mine, other) : max(mine, other);
}

// a stage whose partners (J < KPT apart) sit in the same thread
template <int J>
__device__ __forceinline__ void bitonic_in_thread(unsigned long long (&v)[KPT], int t, int kk) {
    unsigned long long w[KPT];
#pragma unroll
    for (int r = 0; r < KPT; ++r) w[r] = v[r];
#pragma unroll
    for (int r = 0; r < KPT; ++r) v[r] = bitonic_pick(w[r], w[r ^ J], KPT * t + r, J, kk);
}

// Ascending sort of SORT_N keys in shared memory; thread t holds keys KPT t .. KPT t + KPT - 1
// in registers. Partners < KPT apart are in the same thread, < 32 KPT apart in the same warp
// (shuffles); only the stages with partners further apart go through shared memory and a
// barrier (15 of 78 at KPT = 4, 10 at 8). Already-sorted input (an empty or cold cache:
// stamps 0, slot order) returns true after one check, keys untouched; else false. Replaces a
// shared-memory bitonic sort (one barrier per stage) that cost ~45 us per request on the
// H200 (2%-miss, batch 1).
__device__ bool sort_registers(unsigned long long* keys) {
    const int t = threadIdx.x;
    unsigned long long v[KPT];
#pragma unroll
    for (int r = 0; r < KPT; ++r) v[r] = keys[KPT * t + r];
    bool ok = t == NT - 1 || v[KPT - 1] <= keys[KPT * t + KPT];
#pragma unroll
    for (int r = 0; r + 1 < KPT; ++r) ok = ok && v[r] <= v[r + 1];
    if (__syncthreads_and(ok)) return true;
    for (int kk = 2; kk <= SORT_N; kk <<= 1) {
        for (int j = kk >> 1; j > 0; j >>= 1) {
            if (j >= 32 * KPT) {
                __syncthreads();
#pragma unroll
                for (int r = 0; r < KPT; ++r) keys[KPT * t + r] = v[r];
                __syncthreads();
#pragma unroll
                for (int r = 0; r < KPT; ++r) v[r] = bitonic_pick(v[r], keys[(KPT * t + r) ^ j], KPT * t + r, j, kk);
            } else if (j >= KPT) {
#pragma unroll
                for (int r = 0; r < KPT; ++r)
                    v[r] = bitonic_pick(v[r], __shfl_xor_sync(0xffffffffu, v[r], j / KPT), KPT * t + r, j, kk);
            } else if (KPT > 4 && j == 4) {
                bitonic_in_thread<(KPT > 4 ? 4 : 1)>(v, t, kk);
            } else if (j == 2) {
                bitonic_in_thread<2>(v, t, kk);
            } else {
                bitonic_in_thread<1>(v, t, kk);
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < KPT; ++r) keys[KPT * t + r] = v[r];
    __syncthreads();
    return false;
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
