// Ways to read isolated host rows (bench/bench_host_gather.py --variants): which one moves
// sparse, address-sorted rows of mapped host memory over the link fastest. Every kernel
// here computes dst[i] = src[src_idx[i]] (rows of row_bytes, a multiple of 16; src and dst
// 16-byte aligned); the benchmark checks each result against torch's gather.
//
//   ldg<H>        16-byte vector loads, a warp's lanes on consecutive vectors of a row
//                 (kernels/copy.cu's gather), H = the load's L2 prefetch-size hint: 0 none,
//                 1 L2::128B, 2 L2::256B
//   ldg_span      the same over the row's covering 128-byte lines: the vectors outside the
//                 row are loaded too (and dropped), so every host read is a whole line
//   bulk<SPAN>    the tensor memory accelerator: lane 0 of each warp keeps D rows in flight
//                 with cp.async.bulk host -> shared (an mbarrier per stage), then
//                 cp.async.bulk shared -> device; SPAN = 1 reads the covering lines

typedef long long i64;

template <int H>
__device__ __forceinline__ uint4 ldv(const void* p) {
    uint4 v;
    if (H == 1)
        asm volatile("ld.global.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else if (H == 2)
        asm volatile("ld.global.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else
        asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

#define UNROLL 4

template <int H>
__device__ __forceinline__ void ldg_body(char* __restrict__ dst, const char* __restrict__ src,
                                         const i64* __restrict__ src_idx, unsigned n, unsigned row_bytes) {
    const unsigned vpr = row_bytes / 16, total = n * vpr, stride = gridDim.x * blockDim.x;
    for (unsigned base = blockIdx.x * blockDim.x + threadIdx.x; base < total; base += stride * UNROLL) {
        uint4 v[UNROLL];
        i64 d[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const unsigned it = base + u * stride;
            if (it < total) {
                const unsigned r = it / vpr, c = it - r * vpr;
                v[u] = ldv<H>(src + src_idx[r] * row_bytes + (i64)c * 16);
                d[u] = (i64)r * row_bytes + (i64)c * 16;
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (base + u * stride < total) *reinterpret_cast<uint4*>(dst + d[u]) = v[u];
    }
}

extern "C" __global__ void probe_ldg_0(char* dst, const char* src, const i64* idx, unsigned n, unsigned rb) {
    ldg_body<0>(dst, src, idx, n, rb);
}
extern "C" __global__ void probe_ldg_1(char* dst, const char* src, const i64* idx, unsigned n, unsigned rb) {
    ldg_body<1>(dst, src, idx, n, rb);
}
extern "C" __global__ void probe_ldg_2(char* dst, const char* src, const i64* idx, unsigned n, unsigned rb) {
    ldg_body<2>(dst, src, idx, n, rb);
}

// Covering lines: a row's vectors from its first line's start; vspan vectors per row (its
// largest line count x 8), those past its last line not loaded, those outside the row not
// stored.
extern "C" __global__ void probe_ldg_span(char* __restrict__ dst, const char* __restrict__ src,
                                          const i64* __restrict__ src_idx, unsigned n, unsigned row_bytes) {
    const unsigned vspan = ((row_bytes + 127) / 128 + 1) * 8, total = n * vspan;
    const unsigned stride = gridDim.x * blockDim.x;
    for (unsigned base = blockIdx.x * blockDim.x + threadIdx.x; base < total; base += stride * UNROLL) {
        uint4 v[UNROLL];
        i64 d[UNROLL];
        bool keep[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const unsigned it = base + u * stride;
            keep[u] = false;
            if (it < total) {
                const unsigned r = it / vspan, c = it - r * vspan;
                const i64 a = (i64)src + src_idx[r] * row_bytes, lo = a & ~127ll;
                const i64 hi = (a + row_bytes + 127) & ~127ll, at = lo + (i64)c * 16;
                if (at < hi) {
                    v[u] = ldv<0>(reinterpret_cast<const void*>(at));
                    keep[u] = at >= a && at < a + row_bytes;
                    d[u] = (i64)r * row_bytes + (at - a);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (keep[u]) *reinterpret_cast<uint4*>(dst + d[u]) = v[u];
    }
}

// ---- tensor memory accelerator (sm_90) ----
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(unsigned bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done) : "r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_load(unsigned to, const void* from, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(to), "l"(from), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void bulk_store(void* to, unsigned from, unsigned bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(to), "r"(from), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
__device__ __forceinline__ void bulk_store_read_done() {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void bulk_store_done() {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

#define BULK_WARPS 4
#define BULK_DEPTH_MAX 16

// shared: per warp `depth` buffers of `buf` bytes (row_bytes, or its covering lines +128)
template <int SPAN>
__device__ __forceinline__ void bulk_body(char* __restrict__ dst, const char* __restrict__ src,
                                          const i64* __restrict__ src_idx, unsigned n, unsigned row_bytes,
                                          int depth) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bars[BULK_WARPS * BULK_DEPTH_MAX];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane != 0) return;
    const unsigned buf = SPAN ? ((row_bytes + 127) / 128 + 1) * 128 : row_bytes;
    unsigned char* mine = smem + (size_t)warp * depth * buf;
    unsigned long long* bar = bars + warp * BULK_DEPTH_MAX;
    for (int s = 0; s < depth; ++s) mbar_init(smem_addr(bar + s));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const unsigned g = blockIdx.x * BULK_WARPS + warp, G = gridDim.x * BULK_WARPS;
    auto issue = [&](unsigned k) {  // row g + k G into stage k % depth
        const unsigned i = g + k * G;
        const int s = k % depth;
        const i64 a = (i64)src + src_idx[i] * row_bytes;
        const i64 lo = SPAN ? (a & ~127ll) : a;
        const unsigned bytes = SPAN ? (unsigned)(((a + row_bytes + 127) & ~127ll) - lo) : row_bytes;
        mbar_expect(smem_addr(bar + s), bytes);
        bulk_load(smem_addr(mine + (size_t)s * buf), reinterpret_cast<const void*>(lo), bytes, smem_addr(bar + s));
    };
    const unsigned mine_rows = g < n ? (n - g + G - 1) / G : 0;
    for (unsigned k = 0; k < mine_rows && k < (unsigned)depth; ++k) issue(k);
    for (unsigned k = 0; k < mine_rows; ++k) {
        const int s = k % depth;
        mbar_wait(smem_addr(bar + s), (k / depth) & 1);
        const unsigned i = g + k * G;
        const i64 a = (i64)src + src_idx[i] * row_bytes;
        const unsigned off = SPAN ? (unsigned)(a & 127ll) : 0u;
        bulk_store(dst + (i64)i * row_bytes, smem_addr(mine + (size_t)s * buf + off), row_bytes);
        if (k + depth < mine_rows) {
            bulk_store_read_done();  // stage s is read out before its next load lands
            issue(k + depth);
        }
    }
    bulk_store_done();
}

extern "C" __global__ void __launch_bounds__(32 * BULK_WARPS) probe_bulk_0(char* dst, const char* src,
                                                                         const i64* idx, unsigned n, unsigned rb,
                                                                         int depth) {
    bulk_body<0>(dst, src, idx, n, rb, depth);
}
extern "C" __global__ void __launch_bounds__(32 * BULK_WARPS) probe_bulk_1(char* dst, const char* src,
                                                                         const i64* idx, unsigned n, unsigned rb,
                                                                         int depth) {
    bulk_body<1>(dst, src, idx, n, rb, depth);
}
