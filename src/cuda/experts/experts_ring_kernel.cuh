// Grouped expert kernels, cp.async variant: the same work items, tiles, mma fragments, epilogues
// and deterministic combine as experts_kernel.cuh, with the weights streamed through a
// per-thread cp.async ring in shared memory instead of registers.
//
// Why: the register variant holds its in-flight loads in registers (128 per thread cap at two
// CTAs per SM), so each warp streams in rounds of kUnroll blocks with a round trip between
// rounds and a drain at each item's end. Here each thread copies exactly the 16-byte chunks it
// will later feed to its own mma (4 weight chunks + 2 activation chunks per k block) into its
// private ring slots, kStages k blocks ahead, with no register cost; the ring runs on across
// item boundaries (items are statically strided over CTAs, item = blockIdx.x + i * gridDim.x,
// so every warp knows its next item without a barrier) and through the per-item barrier and
// epilogue, so a warp never waits on memory it could have requested earlier.
//
// PDL: the down kernel copies its first kStages - 1 weight blocks before griddepcontrol.wait, so
// it streams W2 while the gate/up kernel drains.
// Work split: warp w takes k blocks w, w+8, w+16, ... of every item (the same count for every
// item of a launch); a warp with no block of an item still joins its barrier.
// Ring: [warp][stage][chunk 0..5][lane] uint4 (consecutive lanes, consecutive 16 bytes: no bank
// conflicts). Activation chunks of tokens past the task's count are zero-filled (src-size 0).
// WAR on a slot: a thread overwrites a slot only after its mma consumed the slot's registers and
// a __syncwarp, so the cp.async never races the ld.shared that read the slot before.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/experts/experts.h"
#include "cuda/experts/experts_kernel.cuh"

namespace moekit::cuda::experts_detail {

constexpr int kRingChunks = 6;  // 4 weight + 2 activation 16-byte chunks per thread per k block

__device__ __forceinline__ void cp_async16(uint32_t smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

template <int kStages>
constexpr int ring_smem_bytes() {
  return kWarps * kStages * kRingChunks * 32 * 16;
}

// kGateUp: gate/up + activation, else down (+ combine). One n-tile (8 tokens) per task.
template <bool kGateUp, int kStages>
__global__ void __launch_bounds__(kThreads, 2) experts_ring_kernel(const ExpertsParams p) {
  static_assert(kStages >= 2 && kStages <= 8, "kStages: 2..8 k blocks in flight per warp");
  constexpr int kTileRows = kGateUp ? 8 : 16;
  extern __shared__ uint4 ring_smem[];
  __shared__ float red[kWarps][4][32];
  __shared__ int s_last;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  // PDL (pdl.cuh): gate/up waits here (the dispatch is the kernel just before); down reads the
  // dispatch (two launches back) and copies its first weight blocks before waiting for h
  if constexpr (kGateUp) pdl_wait();
  const int num_tasks = *p.num_tasks;
  const int tiles = p.rows / kTileRows;
  const int total = num_tasks * tiles;
  const int nkb = p.k / kBlockK;
  const int my_blocks = warp < nkb ? (nkb - warp + kWarps - 1) / kWarps : 0;
  const int stride = gridDim.x;
  if (static_cast<int>(blockIdx.x) >= total) {
    pdl_wait();
    return;
  }

  uint4* my_ring = ring_smem + warp * kStages * kRingChunks * 32;
  const uint32_t ring_base = static_cast<uint32_t>(__cvta_generic_to_shared(my_ring));
  auto slot_addr = [&](int slot, int chunk) -> uint32_t {
    return ring_base + static_cast<uint32_t>(((slot * kRingChunks + chunk) * 32 + lane) * 16);
  };

  // issue cursor: the next (item, block) this thread copies
  int is_item = blockIdx.x, is_blk = 0;
  ItemContext<1> ic = item_context<kGateUp, 1>(p, is_item, num_tasks, g);
  auto active = [&]() { return my_blocks > 0 && is_item < total; };
  auto issue_weights = [&](int slot) {
    if (!active()) return;
    const int off = (warp + kWarps * is_blk) * kBlockK + 8 * t;
    cp_async16(slot_addr(slot, 0), ic.row_lo + off, 16);
    cp_async16(slot_addr(slot, 1), ic.row_lo + off + 32, 16);
    cp_async16(slot_addr(slot, 2), ic.row_hi + off, 16);
    cp_async16(slot_addr(slot, 3), ic.row_hi + off + 32, 16);
  };
  auto issue_acts = [&](int slot) {
    if (!active()) return;
    const int off = (warp + kWarps * is_blk) * kBlockK + 8 * t;
    const bool has_x = ic.xr[0] != nullptr;
    const __nv_bfloat16* xs = has_x ? ic.xr[0] + off : p.x;
    cp_async16(slot_addr(slot, 4), xs, has_x ? 16 : 0);
    cp_async16(slot_addr(slot, 5), has_x ? xs + 32 : p.x, has_x ? 16 : 0);
  };
  auto advance = [&]() {
    if (!active()) return;
    if (++is_blk == my_blocks) {
      is_blk = 0;
      is_item += stride;
      if (is_item < total) ic = item_context<kGateUp, 1>(p, is_item, num_tasks, g);
    }
  };
  auto issue = [&](int slot) {
    issue_weights(slot);
    issue_acts(slot);
    advance();
    cp_async_commit();  // empty groups keep the wait count uniform
  };

  // prologue: kStages - 1 blocks in flight. Down: the weights of all of them first (they join
  // the first group, which the first wait covers), then, after the wait, the activations.
  if constexpr (kGateUp) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s);
  } else {
    const int item0 = is_item, blk0 = is_blk;
    const ItemContext<1> ic0 = ic;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      issue_weights(s);
      advance();
    }
    is_item = item0;
    is_blk = blk0;
    ic = ic0;
    pdl_wait();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      issue_acts(s);
      advance();
      cp_async_commit();
    }
  }
  int slot = 0;

  for (int item = blockIdx.x; item < total; item += stride) {
    // what the epilogue needs, requested now so it arrives during the k loop
    const int tile = item / num_tasks;
    const ExpertTask task = p.tasks[item - tile * num_tasks];
    const int r0 = tile * kTileRows;
    int pair[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = 2 * t + c;
      pair[c] = (warp == 0 && col < task.count) ? p.pair_list[task.begin + col] : -1;
    }

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < my_blocks; ++i) {
      cp_async_wait<kStages - 2>();  // the group of `slot` has landed (this thread's copies)
      uint4 a[4], b[2];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        a[c] = *reinterpret_cast<const uint4*>(my_ring + (slot * kRingChunks + c) * 32 + lane);
      }
      b[0] = *reinterpret_cast<const uint4*>(my_ring + (slot * kRingChunks + 4) * 32 + lane);
      b[1] = *reinterpret_cast<const uint4*>(my_ring + (slot * kRingChunks + 5) * 32 + lane);
      mma_block(acc, a, b);
      __syncwarp();
      // refill the slot consumed one step ago (kStages - 1 blocks ahead of `slot`)
      issue(slot == 0 ? kStages - 1 : slot - 1);
      slot = slot + 1 == kStages ? 0 : slot + 1;
    }

#pragma unroll
    for (int r = 0; r < 4; ++r) red[warp][r][lane] = acc[r];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) s += red[w][r][lane];
        acc[r] = s;
      }
      const float* bias =
          p.bias != nullptr ? p.bias + task.expert * p.bias_expert_stride : nullptr;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        if (pair[c] < 0) continue;
        if constexpr (kGateUp) {
          float gate = acc[c], up = acc[2 + c];
          if (bias != nullptr) {
            gate += bias[r0 + g];
            up += bias[p.inter + r0 + g];
          }
          p.h[static_cast<size_t>(pair[c]) * p.inter + r0 + g] =
              __float2bfloat16_rn(activate(p.activation, gate, up, p.limit, p.alpha, p.beta));
        } else {
          float lo = acc[c], hi = acc[2 + c];
          if (bias != nullptr) {
            lo += bias[r0 + g];
            hi += bias[r0 + g + 8];
          }
          float* out = p.partial + static_cast<size_t>(pair[c]) * p.rows + r0 + g;
          out[0] = lo;
          out[8] = hi;
        }
      }
    }
    if constexpr (!kGateUp) {
      if (p.tile_counters != nullptr) {
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) s_last = atomicAdd(p.tile_counters + tile, 1) == num_tasks - 1;
        __syncthreads();
        if (s_last) {
          __threadfence();
          for (int i = threadIdx.x; i < p.tokens * kTileRows; i += kThreads) {
            const int tok = i / kTileRows;
            const int r = r0 + (i - tok * kTileRows);
            float y = 0.0f;
            for (int s = 0; s < p.slots; ++s) {
              const size_t q = static_cast<size_t>(tok) * p.slots + s;
              y += p.slot_weights[q] * __ldcg(p.partial + q * p.rows + r);
            }
            if (p.shared_partial != nullptr) {
              y += p.shared_scale[tok] *
                   __ldcg(p.shared_partial + static_cast<size_t>(tok) * p.rows + r);
            }
            p.y[static_cast<size_t>(tok) * p.rows + r] = __float2bfloat16_rn(y);
          }
          if (threadIdx.x == 0) p.tile_counters[tile] = 0;
        }
      }
    }
    __syncthreads();  // red is reused by the next item
  }
  cp_async_wait<0>();
}

}  // namespace moekit::cuda::experts_detail
