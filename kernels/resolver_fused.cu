// The fused resolver in one launch (see resolver_common.cuh): the sync-free path's lookup and
// commit separated by a grid barrier instead of a kernel boundary.
//
//   grid = batch request blocks + copy blocks, 1024 threads, one block per SM, launched
//   cooperatively (every block resident at once, or the launch fails: the barrier cannot
//   wait for a block that is never scheduled). Block b < batch runs lookup_body for request
//   b (without the batch sums); then every block meets at grid_barrier; then commit_body
//   with one part: block b commits request b, the others copy the misses, each summing the
//   batch's summaries for its own offsets as the two-launch commit does (sum_batch).
//
// Same results as lookup(host_totals=False) + commit: the code after the barrier is the
// commit's, and what it reads of the lookup's output it reads through L2 (__ldcg), as data
// written by other blocks of the same launch must be. Saves one launch, the wait for the
// lookup grid's completion and the commit's scheduling behind it.
#include "resolver_common.cuh"
#include "resolver_sort.cuh"
#include "resolver_lookup.cu"
#include "resolver_commit.cu"

#define FUSED_ARGS                                                                                      \
    const i64 *__restrict__ table, const i64 *__restrict__ sel, const i64 *__restrict__ visible,            \
        i64 *__restrict__ locs, i64 *__restrict__ need_loc, i64 *__restrict__ misses,                       \
        i32 *__restrict__ victims, i32 *__restrict__ hit_mask, i64 *__restrict__ summary,                  \
        i64 *__restrict__ totals, int batch, int K, int k, int B, int Bp, int T, int p, int words,         \
        i64 finished_epoch, int select_mode, const i64 *__restrict__ stage_locs, i64 n_stage_locs,         \
        i64 *__restrict__ copy_batch, i64 *__restrict__ copy_rows, i64 *__restrict__ copy_dst,             \
        i64 *__restrict__ staged_rows, const i64 *__restrict__ host_ptrs,                                  \
        const i64 *__restrict__ payload_ptrs, int n_layers, unsigned row_bytes, i64 epoch, int copy_blocks

template <int W>
__device__ __forceinline__ void fused_body(FUSED_ARGS) {
    if ((int)blockIdx.x < batch)
        lookup_body<4>(table, sel, visible, locs, need_loc, misses, victims, hit_mask, summary, totals, batch, K,
                       k, B, Bp, T, p, words, finished_epoch, select_mode, 0);
    grid_barrier(reinterpret_cast<unsigned*>(totals + R_BARRIER));
    commit_body<W>(table, sel, locs, need_loc, misses, victims, hit_mask, summary, totals, stage_locs,
                   n_stage_locs, copy_batch, copy_rows, copy_dst, staged_rows, host_ptrs, payload_ptrs, n_layers,
                   batch, K, k, B, row_bytes, epoch, copy_blocks, 1, 1);
}

#define FUSED(W)                                                                                              \
    extern "C" __global__ void __launch_bounds__(NT) resolve_fused_##W(FUSED_ARGS) {                         \
        fused_body<W>(table, sel, visible, locs, need_loc, misses, victims, hit_mask, summary, totals, batch, \
                      K, k, B, Bp, T, p, words, finished_epoch, select_mode, stage_locs, n_stage_locs,        \
                      copy_batch, copy_rows, copy_dst, staged_rows, host_ptrs, payload_ptrs, n_layers,        \
                      row_bytes, epoch, copy_blocks);                                                         \
    }
FUSED(16)
FUSED(8)
FUSED(4)
