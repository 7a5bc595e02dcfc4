// Row copy kernels: gather, page copies, follower layers, draft-ring writes, commits.
//
// Work decomposition (every kernel here): the copy is flattened into
// `n_rows * vecs_per_row` vector items of W bytes (W = 16 when the row size and the
// base pointers allow it, else 8 or 4: the tail path for rows that are not a multiple
// of 16). Item `it` is vector `it % vpr` of row `it / vpr`, so the 32 lanes of a warp
// read 32 consecutive vectors -- whole rows, coalesced -- and a row of 656 B (41
// vectors) does not waste the 23 idle lanes a warp-per-row layout would. Threads
// stride over the items with UNROLL loads issued before the first store, so each
// thread keeps UNROLL independent host reads in flight (zero-copy reads over PCIe take
// ~1-2 us each; 50 GB/s needs ~100 KB in flight, i.e. ~6.5K 16-byte loads).
// Callers sort the work list by source address: the reads then sweep host memory in
// address order (43.6 GB/s vs 21.4 GB/s random for 656 B rows, h200-host-link-limits).
// Pointers are UVA addresses: device memory, or page-locked host memory mapped into the
// device address space (cudaHostAlloc / cudaHostRegister(Mapped)); the same kernels do
// host->device (populate, miss copies), device->device (commit) and device->host (backup).

// No std headers: NVRTC (CuPy) compiles this without a host C++ library.
typedef long long i64;
typedef int i32;
typedef unsigned short u16;

#define UNROLL 4

template <int W> struct Vec;
template <> struct Vec<16> { using T = uint4; };
template <> struct Vec<8> { using T = uint2; };
template <> struct Vec<4> { using T = unsigned int; };

// dst[dst_idx[r]] = src[src_idx[r]] for r < n (row indices, int64).
template <int W>
__device__ __forceinline__ void gather_body(char* __restrict__ dst, const i64* __restrict__ dst_idx,
                                            const char* __restrict__ src, const i64* __restrict__ src_idx,
                                            unsigned n, unsigned row_bytes) {
    using V = typename Vec<W>::T;
    const unsigned vpr = row_bytes / W;
    const unsigned total = n * vpr;
    const unsigned stride = gridDim.x * blockDim.x;
    for (unsigned base = blockIdx.x * blockDim.x + threadIdx.x; base < total; base += stride * UNROLL) {
        V v[UNROLL];
        i64 d[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const unsigned it = base + u * stride;
            if (it < total) {
                const unsigned r = it / vpr, c = it - r * vpr;
                v[u] = *reinterpret_cast<const V*>(src + src_idx[r] * row_bytes + (i64)c * W);
                d[u] = dst_idx[r] * row_bytes + (i64)c * W;
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (base + u * stride < total) *reinterpret_cast<V*>(dst + d[u]) = v[u];
    }
}

// One launch for several layers sharing one plan (follower layers): blockIdx.y = layer;
// dst_ptrs/src_ptrs hold each layer's base address.
template <int W>
__device__ __forceinline__ void gather_layers_body(const i64* dst_ptrs, const i64* dst_idx,
                                                   const i64* src_ptrs, const i64* src_idx,
                                                   unsigned n, unsigned row_bytes) {
    gather_body<W>(reinterpret_cast<char*>(dst_ptrs[blockIdx.y]), dst_idx,
                   reinterpret_cast<const char*>(src_ptrs[blockIdx.y]), src_idx, n, row_bytes);
}

// Draft ring (DESIGN 3.4, eq. 10): row j of src (request ring[j], position pos[j]) goes to
// ring row phi(i, t) = i * R_d + (t mod R_d).
template <int W>
__device__ __forceinline__ void ring_body(char* __restrict__ dst, const i64* __restrict__ ring,
                                          const i64* __restrict__ pos, const char* __restrict__ src,
                                          unsigned n, unsigned row_bytes, i64 ring_rows) {
    using V = typename Vec<W>::T;
    const unsigned vpr = row_bytes / W, total = n * vpr, stride = gridDim.x * blockDim.x;
    for (unsigned it = blockIdx.x * blockDim.x + threadIdx.x; it < total; it += stride) {
        const unsigned r = it / vpr, c = it - r * vpr;
        const i64 drow = ring[r] * ring_rows + pos[r] % ring_rows;
        *reinterpret_cast<V*>(dst + drow * row_bytes + (i64)c * W) =
            *reinterpret_cast<const V*>(src + (i64)r * row_bytes + (i64)c * W);
    }
}

// Commit of accepted speculative rows: entry (b, j) of [batch, K] is copied only when
// j < accepted[b]; accepted stays on the device (no host sync between verify and commit).
template <int W>
__device__ __forceinline__ void commit_body(char* __restrict__ dst, const i64* __restrict__ dst_idx,
                                            const char* __restrict__ src, const i64* __restrict__ src_idx,
                                            const i64* __restrict__ accepted, unsigned batch, unsigned K,
                                            unsigned row_bytes) {
    using V = typename Vec<W>::T;
    const unsigned vpr = row_bytes / W, total = batch * K * vpr, stride = gridDim.x * blockDim.x;
    for (unsigned it = blockIdx.x * blockDim.x + threadIdx.x; it < total; it += stride) {
        const unsigned e = it / vpr, c = it - e * vpr, b = e / K, j = e - b * K;
        if ((i64)j >= accepted[b]) continue;
        *reinterpret_cast<V*>(dst + dst_idx[e] * row_bytes + (i64)c * W) =
            *reinterpret_cast<const V*>(src + src_idx[e] * row_bytes + (i64)c * W);
    }
}

#define INSTANTIATE(W)                                                                                   \
    extern "C" __global__ void gather_rows_##W(char* dst, const i64* dst_idx, const char* src,      \
                                               const i64* src_idx, unsigned n, unsigned row_bytes) { \
        gather_body<W>(dst, dst_idx, src, src_idx, n, row_bytes);                                        \
    }                                                                                                    \
    extern "C" __global__ void gather_layers_##W(const i64* dst_ptrs, const i64* dst_idx,       \
                                                 const i64* src_ptrs, const i64* src_idx,       \
                                                 unsigned n, unsigned row_bytes) {                       \
        gather_layers_body<W>(dst_ptrs, dst_idx, src_ptrs, src_idx, n, row_bytes);                       \
    }                                                                                                    \
    extern "C" __global__ void ring_write_##W(char* dst, const i64* ring, const i64* pos,       \
                                              const char* src, unsigned n, unsigned row_bytes,           \
                                              i64 ring_rows) {                                       \
        ring_body<W>(dst, ring, pos, src, n, row_bytes, ring_rows);                                      \
    }                                                                                                    \
    extern "C" __global__ void commit_rows_##W(char* dst, const i64* dst_idx, const char* src,      \
                                               const i64* src_idx, const i64* accepted,          \
                                               unsigned batch, unsigned K, unsigned row_bytes) {         \
        commit_body<W>(dst, dst_idx, src, src_idx, accepted, batch, K, row_bytes);                       \
    }

INSTANTIATE(16)
INSTANTIATE(8)
INSTANTIATE(4)
