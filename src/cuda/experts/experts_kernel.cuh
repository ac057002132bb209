// Grouped expert kernels for the memory-bound decode regime, with tensor cores doing the math.
//
// Work: tasks {expert e, up to kNT*8 tokens} from the dispatch x row tiles of the expert's output.
// A persistent grid (SMs x resident CTAs) takes (task, tile) work items from an atomic counter
// (zeroed by the dispatch), item -> tile = item / num_tasks, task = item % num_tasks, so the
// tasks sharing a tile run side by side and one expert's token chunks hit L2 together.
//
// One CTA = 8 (or 4) warps on ONE m16 tile of weight rows (fragments and tiles:
// experts_common.cuh); the warps split K in runs of kUnroll blocks of 64 (warp w takes blocks
// [wU, wU+U), [8U+wU, ...)), then reduce through shared memory in warp order (deterministic).
// At T=1 each weight element is loaded once and used once and the tensor cores are never the
// limit (<= 1/8 of their rate even at one token per tile).
//
// Loads: weights with 16-byte ld.global.nc.L1::no_allocate (read once: streamed past L1). A warp
// loads kUnroll blocks (kUnroll * 64 B of weights per thread) before their mma, and the next
// item's first blocks go out before the current item's epilogue, so a CTA keeps bytes in flight
// between items.
//
// Down + combine: each item writes unweighted fp32 partials [pair, 16 rows]; the CTA that
// completes a tile's last item (threadfence + counter) sums y[t] = sum_s w[t,s] * partial in slot
// order (+ the unfused shared MLP's partial), so the result is deterministic: no float atomics.
//
// Preconditions (checked by the layer): k % 64 == 0, gate/up rows % 8 == 0, down rows % 16 == 0,
// task.count <= kNT * 8, 16-byte aligned rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/experts/experts.h"
#include "cuda/experts/experts_common.cuh"
#include "cuda/common/pdl.cuh"

namespace moekit::cuda::experts_detail {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

__device__ __forceinline__ uint4 ld_stream(const __nv_bfloat16* ptr) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr));
  return v;
}

__device__ __forceinline__ uint4 ld_act(const __nv_bfloat16* ptr) {
  return __ldg(reinterpret_cast<const uint4*>(ptr));
}

// What one work item needs: its task, its tile, the weight rows and activation rows of this thread.
template <int kNT>
struct ItemContext {
  ExpertTask task;
  int tile;
  int r0;
  int ntiles;  // n-tiles holding tokens
  const __nv_bfloat16* row_lo;
  const __nv_bfloat16* row_hi;
  const __nv_bfloat16* xr[kNT];  // activation row of token (j*8 + g), null past task.count
};

template <bool kGateUp, int kNT>
__device__ __forceinline__ ItemContext<kNT> item_context(const ExpertsParams& p, int item,
                                                         int num_tasks, int g) {
  constexpr int kTileRows = kGateUp ? 8 : 16;
  ItemContext<kNT> c;
  c.tile = item / num_tasks;
  c.task = p.tasks[item - c.tile * num_tasks];
  c.r0 = c.tile * kTileRows;
  c.ntiles = (c.task.count + 7) >> 3;
  const __nv_bfloat16* wexp = p.w + static_cast<long long>(c.task.expert) * p.w_expert_stride;
  c.row_lo = wexp + static_cast<size_t>(c.r0 + g) * p.k;
  c.row_hi = kGateUp ? wexp + static_cast<size_t>(p.inter + c.r0 + g) * p.k
                     : c.row_lo + 8 * static_cast<size_t>(p.k);
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    const int col = j * 8 + g;
    c.xr[j] = nullptr;
    if (col < c.task.count) {
      const int pair = p.pair_list[c.task.begin + col];
      c.xr[j] = p.x + static_cast<size_t>(p.x_row.of(pair)) * p.k;
    }
  }
  return c;
}

// Issues the weight loads of k blocks [kb0, kb0 + kUnroll) (those < nkb) of one item.
template <int kNT, int kUnroll>
__device__ __forceinline__ void load_weights(const ItemContext<kNT>& c, int kb0, int nkb, int t,
                                             uint4 (&a)[kUnroll][4]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int off = (kb0 + u) * kBlockK + 8 * t;
    if (kb0 + u < nkb) {
      a[u][0] = ld_stream(c.row_lo + off);
      a[u][1] = ld_stream(c.row_lo + off + 32);
      a[u][2] = ld_stream(c.row_hi + off);
      a[u][3] = ld_stream(c.row_hi + off + 32);
    }
  }
}

// The activation loads of the same blocks (zero for tokens past the task's count).
template <int kNT, int kUnroll>
__device__ __forceinline__ void load_acts(const ItemContext<kNT>& c, int kb0, int nkb, int t,
                                          uint4 (&b)[kUnroll][kNT][2]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int off = (kb0 + u) * kBlockK + 8 * t;
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      if (kb0 + u < nkb && c.xr[j] != nullptr) {
        b[u][j][0] = ld_act(c.xr[j] + off);
        b[u][j][1] = ld_act(c.xr[j] + off + 32);
      } else {
        b[u][j][0] = make_uint4(0, 0, 0, 0);
        b[u][j][1] = make_uint4(0, 0, 0, 0);
      }
    }
  }
}

// kLateActs: only the weights (the activation fragments are loaded right before their mma).
template <int kNT, int kUnroll, bool kLateActs, int kBU>
__device__ __forceinline__ void load_blocks(const ItemContext<kNT>& c, int kb0, int nkb, int t,
                                            uint4 (&a)[kUnroll][4], uint4 (&b)[kBU][kNT][2]) {
  load_weights<kNT, kUnroll>(c, kb0, nkb, t, a);
  if constexpr (!kLateActs) load_acts<kNT, kUnroll>(c, kb0, nkb, t, b);
}

// kGateUp: gate/up + activation, else down (+ combine). kNT: n-tiles of 8 tokens per task.
// kUnroll: k blocks each warp loads before computing.
// kLateActs: the activation fragments (x or h rows: a few KB per token, L1/L2-resident, shared
// by every tile of the task) are loaded right before their mma instead of with the weights, so
// their registers (8 per block and n-tile) go to weights: kUnroll = 4 fits 128 registers without
// spills (4 x 64 B of weights in flight per thread, 128 KB per SM instead of 96 KB), at the
// cost of an L1-hit latency per run of blocks.
//
// Pipelining across items: the next item's index is fetched while the current one streams, and
// its first kUnroll blocks are loaded before the current item's reduction and epilogue, so a
// CTA keeps weight bytes in flight through its epilogues.
// kW: warps per CTA (8, or 4 at 4 CTAs per SM for a K that one round of 4 warps covers: the
// small-K down items keep all warps loading and twice as many items in flight per SM).
template <bool kGateUp, int kNT, int kUnroll, bool kLateActs, int kW = kWarps>
__global__ void __launch_bounds__(kW * 32, 16 / kW) experts_kernel(const ExpertsParams p) {
  static_assert(kNT >= 1 && kNT <= 4, "kNT: 1..4 n-tiles of 8 tokens");
  static_assert(kUnroll >= 1 && kUnroll <= 8, "kUnroll: 1..8 k blocks in flight per warp");
  static_assert(kW == 4 || kW == 8, "kW: 4 or 8 warps");
  constexpr int kTileRows = kGateUp ? 8 : 16;
  __shared__ float red[kW][kNT * 4][32];
  __shared__ int s_item[2];
  __shared__ int s_last;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  if constexpr (kGateUp) {
    pdl_wait();  // the dispatch is the kernel just before
    // Let the down kernel's CTAs launch now: they take the SM slots our CTAs free when they run
    // out of items and stream their first W2 blocks through our tail (they wait for our
    // completion before reading h). Without this trigger the dependent grid launched only when
    // every CTA had exited (PTX: launch_dependents or completion of all CTAs), so the tail was
    // not overlapped. After pdl_wait: the down kernel reads the dispatch before its own wait,
    // and every CTA of ours passing pdl_wait means the dispatch has completed.
    pdl_launch_dependents();
  }
  // PDL (pdl.cuh): the down kernel reads the dispatch (two launches back) and streams its first
  // weights while the gate/up kernel drains, and waits only before touching h.
  // The first item's atomic goes out before the task count is read, so the two L2 round trips
  // overlap (both are on the critical path from the dispatch to the first weight loads).
  if (threadIdx.x == 0) s_item[0] = atomicAdd(p.work_counter, 1);
  const int num_tasks = *p.num_tasks;
  const int tiles = p.rows / kTileRows;
  const int total = num_tasks * tiles;
  const int nkb = p.k / kBlockK;
  const int kb_first = warp * kUnroll;
  __syncthreads();
  int item = s_item[0];
  if (item >= total) {
    pdl_wait();
    return;
  }
  ItemContext<kNT> ctx = item_context<kGateUp, kNT>(p, item, num_tasks, g);
  constexpr int kBU = kLateActs ? 1 : kUnroll;  // activation blocks held in registers
  uint4 a[kUnroll][4];
  uint4 b[kBU][kNT][2];
  load_weights<kNT, kUnroll>(ctx, kb_first, nkb, t, a);
  if constexpr (!kGateUp) pdl_wait();
  if constexpr (!kLateActs) load_acts<kNT, kUnroll>(ctx, kb_first, nkb, t, b);

  for (int parity = 0;; parity ^= 1) {
    // the next item's index, published by the barrier after the main loop
    if (threadIdx.x == 0) s_item[parity ^ 1] = atomicAdd(p.work_counter, 1);

    float acc[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    // main loop: compute on the loaded blocks, then load this warp's next run of blocks.
    // kLateActs: rolling instead: block u's registers are refilled with block u of the next run
    // right after its mma, so the warp's weight loads keep flowing while it waits on the
    // activation loads of the other blocks (L2 hits when the tokens change from item to item).
    for (int kb0 = kb_first; kb0 < nkb; kb0 += kW * kUnroll) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (kb0 + u < nkb) {
          if constexpr (kLateActs) load_acts<kNT, 1>(ctx, kb0 + u, nkb, t, b);
#pragma unroll
          for (int j = 0; j < kNT; ++j) {
            if (j < ctx.ntiles) mma_block(acc[j], a[u], b[kLateActs ? 0 : u][j]);
          }
        }
        if constexpr (kLateActs) {
          const int kbn = kb0 + kW * kUnroll + u;
          if (kbn < nkb) {
            const int off = kbn * kBlockK + 8 * t;
            a[u][0] = ld_stream(ctx.row_lo + off);
            a[u][1] = ld_stream(ctx.row_lo + off + 32);
            a[u][2] = ld_stream(ctx.row_hi + off);
            a[u][3] = ld_stream(ctx.row_hi + off + 32);
          }
        }
      }
      if (!kLateActs && kb0 + kW * kUnroll < nkb) {
        load_blocks<kNT, kUnroll, kLateActs>(ctx, kb0 + kW * kUnroll, nkb, t, a, b);
      }
    }

#pragma unroll
    for (int j = 0; j < kNT; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) red[warp][j * 4 + r][lane] = acc[j][r];
    }
    __syncthreads();

    // prefetch: the next item's first blocks go out before this item's epilogue (warps 1..) or
    // right after it (warp 0, whose epilogue needs the registers the loads would occupy); in
    // down mode also before the combine's threadfence, tile-counter round trip and sums, so the
    // CTA keeps weight bytes in flight through them (small-K down items are one load round)
    const int next = s_item[parity ^ 1];
    ItemContext<kNT> next_ctx;
    if (next < total) next_ctx = item_context<kGateUp, kNT>(p, next, num_tasks, g);
    if (warp != 0 && next < total) {
      load_blocks<kNT, kUnroll, kLateActs>(next_ctx, kb_first, nkb, t, a, b);
    }

    // reduce across the warps that split K, in warp order; epilogue on warp 0
    if (warp == 0) {
      const RowBias bias = load_row_bias<kGateUp>(p, ctx.task.expert, ctx.r0, g);
      sum_warp_partials<kW, kNT>(&red[0][0][0], lane, acc);
      store_item_outputs<kGateUp, kNT>(p, ctx.r0, ctx.task.count, p.pair_list + ctx.task.begin, acc,
                                       bias, g, t);
      // down: only warp 0 wrote partials, so only it fences them before the tile counter, and
      // before its prefetch, so that the fence does not wait on the next item's loads
      if (!kGateUp && p.tile_counters != nullptr) __threadfence();
      if (next < total) load_blocks<kNT, kUnroll, kLateActs>(next_ctx, kb_first, nkb, t, a, b);
    }

    if constexpr (!kGateUp) {
      if (p.tile_counters != nullptr) {
        // the last item of this tile combines it, in slot order (warp 0's partials fenced above)
        __syncthreads();
        if (threadIdx.x == 0) {
          s_last = atomicAdd(p.tile_counters + ctx.tile, 1) == num_tasks - 1;
        }
        __syncthreads();
        if (s_last) {
          __threadfence();
          combine_tile<1, 1>(p, ctx.tile, threadIdx.x, kW * 32);
          if (threadIdx.x == 0) p.tile_counters[ctx.tile] = 0;
        }
      }
    }
    __syncthreads();  // red and s_item are reused by the next item
    if (next >= total) break;
    ctx = next_ctx;
  }
}

}  // namespace moekit::cuda::experts_detail
