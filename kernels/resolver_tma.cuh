#ifndef DHISPARSE_RESOLVER_TMA_CUH
#define DHISPARSE_RESOLVER_TMA_CUH
// Row copies by the tensor memory accelerator (sm_90): cp.async.bulk of a whole row from
// mapped host memory into shared memory (completion counted on an mbarrier), then
// cp.async.bulk of the row from shared memory to device memory. Sizes and both addresses
// must be multiples of 16 bytes. Used by the commit's miss copies (resolver_copy.cuh
// copy_rows_tma) when the rows are whole 128-byte lines: isolated 1152 B rows read at
// 90-92% of the pinned memcpy against 84-88% by 16-byte loads (H200, a0f94ab,
// bench/bench_host_gather.py --variants, bench/README.md "Host memory").
#include "resolver_common.cuh"

#define TMA_WARPS 4  // warps of a copy block keeping rows in flight (lane 0 each)
#define TMA_STAGES 16  // shared row buffers per such warp: the preload fills them all ...
#define TMA_DEPTH 4  // ... and once the copies run, this many rows stay in flight per warp
#define TMA_ROWS (TMA_WARPS * TMA_STAGES)

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(unsigned long long* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
}
// the inits are seen by the bulk copies (async proxy) that complete on these barriers
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
}
// bytes from global (host) `from` into shared `to`; the barrier's phase completes on arrival
__device__ __forceinline__ void bulk_load(void* to, const void* from, unsigned bytes, unsigned long long* bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(to)), "l"(from), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void bulk_store(void* to, const void* from, unsigned bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(to), "r"(smem_u32(from)),
                 "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// the stores issued so far have read their shared memory (it may take the next load) ...
__device__ __forceinline__ void bulk_stores_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
// ... or have completed
__device__ __forceinline__ void bulk_stores_done() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
#else  // not reached below sm_90 (the wrappers keep tma = 0 there); keeps the source compiling
__device__ __forceinline__ void mbar_init(unsigned long long*) {}
__device__ __forceinline__ void mbar_init_fence() {}
__device__ __forceinline__ void mbar_wait(unsigned long long*, unsigned) {}
__device__ __forceinline__ void bulk_load(void*, const void*, unsigned, unsigned long long*) {}
__device__ __forceinline__ void bulk_store(void*, const void*, unsigned) {}
__device__ __forceinline__ void bulk_stores_read() {}
__device__ __forceinline__ void bulk_stores_done() {}
#endif

#endif
