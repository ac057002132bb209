// The engine API's dispatch of a routing (MoeOp::experts, and forward on an expert slice;
// src/cuda/engine/engine.cu): topk ids (global) and weights [T, k] -> the workspace's ids
// (local rows of the view's stacks) and weights [T, k + S] (the fused slots appended with the
// token's shared scale, as the routing kernel appends them) and shared_scale [T], then the same
// dispatch lists the routing kernel's align step builds (cuda/routing/align.cuh), in one launch
// of one CTA.
//   global id g in [offset, offset + count)  -> row g - offset
//   g outside the slice (another rank's)      -> dropped: id -1, weight 0
//   g outside [0, E)                          -> dropped, and *status |= 1
// The fused slot j is row count + j. rp.error_flag is null: the align step drops the -1 pairs
// without an error. On the decode kernels a dropped pair's fp32 partial row is not written, yet
// the combine reads it (times weight 0): zero_dropped_partials zeroes those rows, so a slice's y
// is the exact sum over its own pairs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/routing/routing.h"

namespace moekit::cuda {

struct EngineDispatchParams {
  RoutingParams rp;                        // ids/weights/lists in the workspace; cfg.top_k = k,
                                           // cfg.shared_slots = the fused slots of this call
  const int32_t* topk_ids = nullptr;       // [T, k], global ids
  const float* topk_weights = nullptr;     // [T, k]
  const float* shared_scale_in = nullptr;  // [T] or null (1)
  int expert_offset = 0;                   // the slice the stacks hold
  int expert_count = 0;
  int* status = nullptr;  // the workspace's status word
};

void launch_engine_dispatch(const EngineDispatchParams& p, cudaStream_t stream);

// partial[q, 0..hidden) = 0 for every pair q of [0, pairs) whose id is -1.
void zero_dropped_partials(const int32_t* ids, int pairs, float* partial, int hidden,
                           cudaStream_t stream);

}  // namespace moekit::cuda
