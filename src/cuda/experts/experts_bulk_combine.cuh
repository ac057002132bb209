// The bulk expert kernel's (experts_bulk_kernel.cuh) combine of its down outputs: the epilogue
// warp's combine of a down tile, the down tail's wait for the grid and its combine; and
// self_route_token, the self-routing gate/up kernel's routing of its token.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cuda/common/trace.cuh"
#include "cuda/experts/bulk_copy.cuh"
#include "cuda/experts/experts.h"
#include "cuda/experts/experts_bulk_layout.cuh"
#include "cuda/experts/experts_common.cuh"
#include "cuda/routing/routing_kernel.cuh"

namespace moekit::cuda::experts_detail {

// The epilogue warp's one-shot combine of a down tile (combine_tile), in the down instances that
// run at <= 8 tokens only (the rings, the split rows: kCombineInPasses false): at 1-4 tokens
// (16-64 outputs) all slots (up to 16) of 1-2 outputs per lane in one batch of loads, one L2
// round trip per tile instead of 3 (9 slots, 4 at a time); at 5-8 tokens 4 outputs x 8 slots;
// above, 8 x 4. (More loads in flight spill: the kernel's 168 registers.)
__device__ __forceinline__ void bulk_combine_tile(const ExpertsParams& dn, int tile, int lane) {
  const int outputs = dn.tokens * 16;
  if (outputs <= 32) {
    combine_tile<1, 16>(dn, tile, lane, 32);
  } else if (outputs <= 64) {
    combine_tile<2, 16>(dn, tile, lane, 32);
  } else if (outputs <= 128) {
    combine_tile<4, 8>(dn, tile, lane, 32);
  } else {
    combine_tile<8, 4>(dn, tile, lane, 32);
  }
}

// Pass `pass` (0, 1, ...) of the epilogue warp's combine of a down tile; true while passes
// remain. At 1-4 tokens (16-64 outputs) one pass, bulk_combine_tile's (quads are slower there:
// docs/decisions/experts_bulk_design.md).
// Above, quads (combine_tile_quads_pass, 4 rows per load): up to 8 tokens one unit per lane with
// all its slots (one round trip), up to 16 tokens 2 units x 8 slots, then passes of 4 units x 4
// slots (128 tokens, 9 slots: 4 passes of 3 round trips; 4 x 5 spilled in the L2-keeping
// dynamic-tail instance, the kernel's registers being capped at 168).
__device__ __forceinline__ bool bulk_combine_pass(const ExpertsParams& dn, int tile, int pass,
                                                  int lane) {
  const int outputs = dn.tokens * 16, units = dn.tokens * 4;
  if (outputs <= 32) {
    combine_tile<1, 16>(dn, tile, lane, 32);
    return false;
  }
  if (outputs <= 64) {
    combine_tile<2, 16>(dn, tile, lane, 32);
    return false;
  }
  if (units <= 32) return combine_tile_quads_pass<1, 16>(dn, tile, pass, lane, 32);
  if (units <= 64) return combine_tile_quads_pass<2, 8>(dn, tile, pass, lane, 32);
  return combine_tile_quads_pass<4, 4>(dn, tile, pass, lane, 32);
}

__device__ __forceinline__ int load_relaxed_gpu(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Orders this thread's generic-proxy accesses of global memory with its async-proxy ones (the
// bulk copies): h written by st.global in one CTA is read by cp.async.bulk in another.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

__device__ __forceinline__ void fence_acq_rel_gpu() {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// The down kernel's dynamic tail (kTail): its tiles' items went to whichever CTA claimed them,
// so a tail tile is combined only once every CTA has written its partials (counting each
// claimed item in its tile counter, a fence and an atomic per item, makes the epilogue the
// bottleneck: docs/decisions/experts_down_tail.md). The epilogue warp counts its CTA in
// ctas_done (zeroed by the dispatch) and waits for the grid; safe to spin: the grid is at most
// the resident CTAs (the plan's grid), and all of them were resident before the next kernel
// could launch (each passed its griddepcontrol.launch_dependents).
__device__ __forceinline__ void wait_for_every_cta(int* ctas_done, int lane) {
  __threadfence();  // every lane: its partial stores before the count
  __syncwarp();
  if (lane == 0) {
    atomicAdd(ctas_done, 1);
    const unsigned long long t0 = global_timer_ns();
    while (load_relaxed_gpu(ctas_done) < static_cast<int>(gridDim.x)) {
      // why a deadline: a grid larger than the resident CTAs would spin forever; fail loudly
      if (global_timer_ns() - t0 > 4000000000ull) {
        printf("moekit: down kernel: CTA %d waited 4 s for the other CTAs' partials (grid %d "
               "larger than the resident CTAs?)\n",
               static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
        __trap();
      }
      __nanosleep(128);
    }
  }
  __syncwarp();
  fence_acq_rel_gpu();  // every lane, after lane 0 saw the count: the other CTAs' partials
}

// The tail tiles' [first, tiles) outputs combined by `nthreads` threads of the grid, thread
// `thread` taking units thread, thread + nthreads, ... of them all (combine_quads: 4 rows of one
// token per unit, token-major within a tile), two units and five slots per batch of loads. why
// spread so: one warp per tail tile would combine alone after the grid's wait while the rest of
// the grid idles (docs/decisions/experts_down_tail.md). Each row's sum is combine_tile's.
__device__ __forceinline__ void combine_tail_outputs(const ExpertsParams& p, int first,
                                                     int tiles, int thread, int nthreads) {
  const int per_tile = p.tokens * 4;
  combine_quads<2, 5>(p, (tiles - first) * per_tile, thread, nthreads,
                      [&](int i, int& tok, int& r) {
                        const int t = i / per_tile;
                        const int within = i - t * per_tile;
                        tok = within >> 2;
                        r = (first + t) * 16 + 4 * (within & 3);
                      });
}

// The warps that combine the down tail: the consumers and the epilogue warp. The consumers start
// once the epilogue warp has seen every CTA's partials, waiting on an mbarrier its lanes arrive
// on (BulkLayout::kTailBarOffset). why not a named barrier (bar.sync 1, 288): the two reach it
// at different instructions, and bar.sync is barrier.sync.aligned, which requires every thread
// to execute the same one (PTX ISA; compute-sanitizer's synccheck reports "divergent threads in
// block"); barrier.sync (not aligned) is correct but slower, the compiler merging the two paths
// (docs/decisions/experts_down_tail.md).
constexpr int kTailCombineThreads = (kBulkConsumerWarps + 1) * 32;

// kSelfRoute: the routing of the launch's one token by this warp (route_token, the routing
// kernel's code: the same ids; kPer experts a lane, E <= 32 kPer), after the wait for the router
// GEMM. write: also the ids and weights, and through align_small the dispatch and counters the
// down kernel reads (CTA 0's epilogue warp), else only lane j's pick j in `pick`.
template <int kPer>
__device__ __forceinline__ void self_route_token(const RoutingParams& p, int lane, bool write,
                                                 int* local_ids, int* pick) {
  float bias[kPer];
  routing_detail::load_correction_bias<kPer>(p, lane, bias);
  routing_detail::route_token<kPer>(p, 0, lane, write, bias, local_ids, pick);
}

}  // namespace moekit::cuda::experts_detail
