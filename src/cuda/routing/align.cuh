// Dispatch ("align") on the GPU: per-expert lists of (token, slot) pairs and the task list the
// expert kernels walk, built by ONE thread block with no host synchronisation.
//
// Input: ids [T, slots] (routed ids, then the fused shared ids E..E+S-1). The experts are counted
// over the WEIGHT ROWS (E + S), never over the routed E alone: counting only E is the classic
// bug where shared ids fall out of range and silently corrupt the output. An id outside
// [0, E+S) sets *error_flag (the host checks it in forward()) and is dropped; with no error_flag
// (an expert slice's dispatch, where -1 marks another rank's pair) it is only dropped.
//
//   counts[e]   shared-memory atomics over all T*slots pairs
//   scan        block-wide exclusive scan of (count, ceil(count/chunk)) -> list offsets, task ids
//   tasks       expert e's pairs become ceil(n_e/chunk) tasks {e, begin, count <= chunk}, in
//               expert order; counters->num_tasks = their number
//   pair_list   pair q = t*slots + s placed in its expert's segment (order inside a segment is
//               free: each token is its own GEMM column, so results do not depend on it)
//   unfused     shared_tasks = ceil(T/chunk) chunks of tokens 0..T-1 for the shared MLP
//   counters    work-item counters, combine tile counters and the fused expert kernel's per-task
//               gate/up counters zeroed for the kernels that follow
//
// Runs in the routing kernel's last CTA (routing_kernel.cuh), so tiny batches pay no extra launch
// and no sort: at T=1 it is nine pairs. Loops stay rolled (`unroll 1`): the code is fetched cold.
#pragma once

#include <cuda_runtime.h>

#include "cuda/routing/routing.h"

namespace moekit::cuda::align_detail {

constexpr int kAlignMaxWarps = 32;

// Exclusive block scan of two ints; every thread gets its prefix and the totals.
__device__ __forceinline__ void block_exclusive_scan2(int a, int b, int& pa, int& pb, int& ta,
                                                      int& tb) {
  __shared__ int warp_a[kAlignMaxWarps], warp_b[kAlignMaxWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  int ia = a, ib = b;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int ua = __shfl_up_sync(0xffffffffu, ia, off);
    const int ub = __shfl_up_sync(0xffffffffu, ib, off);
    if (lane >= off) {
      ia += ua;
      ib += ub;
    }
  }
  if (lane == 31) {
    warp_a[warp] = ia;
    warp_b[warp] = ib;
  }
  __syncthreads();
  int base_a = 0, base_b = 0, all_a = 0, all_b = 0;
#pragma unroll 1
  for (int w = 0; w < nwarps; ++w) {
    if (w < warp) {
      base_a += warp_a[w];
      base_b += warp_b[w];
    }
    all_a += warp_a[w];
    all_b += warp_b[w];
  }
  pa = base_a + ia - a;
  pb = base_b + ib - b;
  ta = all_a;
  tb = all_b;
  __syncthreads();
}

// The unfused shared MLP's tasks (token chunks, when it runs) and the combine's tile counters
// zeroed, by threads tid, tid + nthreads, ... Returns the number of shared tasks.
__device__ __forceinline__ int write_shared_tasks_zero_tiles(const RoutingParams& p, int tid,
                                                             int nthreads) {
  const int chunk = p.chunk;
  const int shared_chunks = (p.tokens + chunk - 1) / chunk;
  if (p.shared_tasks != nullptr) {
#pragma unroll 1
    for (int c = tid; c < shared_chunks; c += nthreads) {
      p.shared_tasks[c] = ExpertTask{0, c * chunk, min(chunk, p.tokens - c * chunk),
                                     (c + 1) * chunk < p.tokens ? 1 : 0};
    }
  }
#pragma unroll 1
  for (int i = tid; i < p.num_tile_counters; i += nthreads) p.tile_counters[i] = 0;
  return shared_chunks;
}

// The task counts for the expert kernels, and their work counters zeroed (one thread).
__device__ __forceinline__ void publish_counts(const RoutingParams& p, int total_tasks,
                                               int shared_chunks) {
  p.counters->num_tasks = total_tasks;
  p.counters->num_shared_tasks = p.shared_tasks != nullptr ? shared_chunks : 0;
  p.counters->routing_done = 0;
  for (int i = 0; i < 4; ++i) p.counters->work[i] = 0;
}

// local_ids: null, or the ids in this CTA's shared memory (a one-CTA routing grid), read
// instead of p.ids.
__device__ __forceinline__ void align_block(const RoutingParams& p, const int* local_ids) {
  __shared__ int counts[kAlignMaxRows];
  __shared__ int cursor[kAlignMaxRows];
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int rows = p.weight_rows;
  const int slots = p.cfg.top_k + p.cfg.shared_slots;
  const int pairs = p.tokens * slots;
  const int chunk = p.chunk;

#pragma unroll 1
  for (int e = tid; e < rows; e += nthreads) counts[e] = 0;
  __syncthreads();
#pragma unroll 1
  for (int q = tid; q < pairs; q += nthreads) {
    const int e = local_ids != nullptr ? local_ids[q] : __ldcg(p.ids + q);
    if (e >= 0 && e < rows) {
      atomicAdd(&counts[e], 1);
    } else if (p.error_flag != nullptr) {
      atomicExch(p.error_flag, 1);
    }
  }
  __syncthreads();

  // scan over contiguous runs of experts per thread
  const int per = (rows + nthreads - 1) / nthreads;
  const int e0 = min(tid * per, rows), e1 = min(e0 + per, rows);
  int my_pairs = 0, my_tasks = 0;
#pragma unroll 1
  for (int e = e0; e < e1; ++e) {
    my_pairs += counts[e];
    my_tasks += (counts[e] + chunk - 1) / chunk;
  }
  int pair_base, task_base, total_pairs, total_tasks;
  block_exclusive_scan2(my_pairs, my_tasks, pair_base, task_base, total_pairs, total_tasks);
#pragma unroll 1
  for (int e = e0; e < e1; ++e) {
    const int n = counts[e];
    cursor[e] = pair_base;
#pragma unroll 1
    for (int c = 0; c * chunk < n; ++c) {
      p.tasks[task_base++] =
          ExpertTask{e, pair_base + c * chunk, min(chunk, n - c * chunk), (c + 1) * chunk < n};
    }
    pair_base += n;
  }
  __syncthreads();

#pragma unroll 1
  for (int q = tid; q < pairs; q += nthreads) {
    const int e = local_ids != nullptr ? local_ids[q] : __ldcg(p.ids + q);
    if (e >= 0 && e < rows) p.pair_list[atomicAdd(&cursor[e], 1)] = q;
  }

  const int shared_chunks = write_shared_tasks_zero_tiles(p, tid, nthreads);
  if (p.task_done != nullptr) {
#pragma unroll 1
    for (int i = tid; i < total_tasks; i += nthreads) p.task_done[i] = 0;
  }
  if (tid == 0) publish_counts(p, total_tasks, shared_chunks);
}

// The same lists for a one-CTA grid of at most 32 pairs (decode: DeepSeek-V3 up to 3 tokens,
// Qwen3-30B-A3B up to 4), built by warp 0 with warp collectives: lane q holds pair q's expert,
// __match_any_sync finds the pairs of the same expert, one pass over the lanes counts the pairs
// and tasks of the smaller expert ids. No shared-memory counting, no block scan, no
// __syncthreads; the other warps zero the counters meanwhile (faster than align_block at one
// token: docs/design/gpu_layer.md).
// Preconditions: p.tokens * slots <= 32; ids in local_ids (shared memory, written by this CTA
// before a __syncthreads). tid, nthreads: this thread among the nthreads (>= 32) that call it;
// thread 0's warp builds the lists.
__device__ __forceinline__ void align_small(const RoutingParams& p, const int* local_ids, int tid,
                                            int nthreads) {
  const int lane = tid & 31;
  const int rows = p.weight_rows;
  const int slots = p.cfg.top_k + p.cfg.shared_slots;
  const int pairs = p.tokens * slots;
  const int chunk = p.chunk;
  const int shared_chunks = write_shared_tasks_zero_tiles(p, tid, nthreads);
  if (tid >= 32) return;

  const int e = lane < pairs ? local_ids[lane] : -1;
  const bool valid = e >= 0 && e < rows;
  if (lane < pairs && !valid && p.error_flag != nullptr) atomicExch(p.error_flag, 1);
  // invalid and unused lanes sort after every expert and are never written
  const int key = valid ? e : rows;
  const unsigned peers = __match_any_sync(0xffffffffu, key);
  const unsigned below = (1u << lane) - 1u;
  const int n = __popc(peers);
  const bool leader = valid && (peers & below) == 0;
  const int my_tasks = leader ? (n + chunk - 1) / chunk : 0;
  int pairs_before = 0, tasks_before = 0;
#pragma unroll 1
  for (int l = 0; l < pairs; ++l) {
    const int kl = __shfl_sync(0xffffffffu, key, l);
    const int tl = __shfl_sync(0xffffffffu, my_tasks, l);
    if (kl < key) {
      ++pairs_before;
      tasks_before += tl;
    }
  }
  const int total_tasks = __reduce_add_sync(0xffffffffu, my_tasks);
  if (valid) p.pair_list[pairs_before + __popc(peers & below)] = lane;
#pragma unroll 1
  for (int c = 0; c < my_tasks; ++c) {
    p.tasks[tasks_before + c] =
        ExpertTask{e, pairs_before + c * chunk, min(chunk, n - c * chunk), (c + 1) * chunk < n};
  }
  if (p.task_done != nullptr && lane < total_tasks) p.task_done[lane] = 0;
  if (lane == 0) publish_counts(p, total_tasks, shared_chunks);
}

__device__ __forceinline__ void align_small(const RoutingParams& p, const int* local_ids) {
  align_small(p, local_ids, threadIdx.x, blockDim.x);
}

// align_small's task and pair lists for ONE token whose top_k picks are distinct experts, in
// registers instead of memory: lane j holds pick j in `pick`; lane r gets task r and pair-list
// entry r as align_small writes them (tasks in expert order, one pair each: task r is
// {expert of rank r, r, 1, 0}, entry r its slot), then the fused shared slots' tasks (lane
// top_k + s: shared expert s, id num_experts + s, the largest ids, slot top_k + s). Returns the
// task count, top_k + shared_slots. For the gate/up kernel that routes its token itself
// (ExpertsParams::self_route).
__device__ __forceinline__ int one_token_dispatch_lanes(const RoutingConfig& cfg, int pick,
                                                        int lane, ExpertTask& task, int& pair) {
  const int top_k = cfg.top_k;
  const int key = lane < top_k ? pick : 0x7fffffff;
  int rank = 0;
#pragma unroll 1
  for (int l = 0; l < top_k; ++l) rank += __shfl_sync(0xffffffffu, key, l) < key;
  task = ExpertTask{0, 0, 0, 0};
  pair = 0;
#pragma unroll 1
  for (int j = 0; j < top_k; ++j) {
    const int rank_j = __shfl_sync(0xffffffffu, rank, j);
    const int expert_j = __shfl_sync(0xffffffffu, key, j);
    if (rank_j == lane) {
      task = ExpertTask{expert_j, lane, 1, 0};
      pair = j;
    }
  }
  const int slots = top_k + cfg.shared_slots;
  if (lane >= top_k && lane < slots) {
    task = ExpertTask{cfg.num_experts + (lane - top_k), lane, 1, 0};
    pair = lane;
  }
  return slots;
}

}  // namespace moekit::cuda::align_detail
