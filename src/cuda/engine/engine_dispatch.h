// The engine API's dispatch of a caller's routing (MoeOp::experts, src/cuda/engine/engine.cu):
// the caller's topk ids and weights [T, k] -> the workspace's ids and weights [T, k + S] (the
// fused slots E..E+S-1 appended with the token's shared scale, as the routing kernel appends
// them) and shared_scale [T], then the same dispatch lists the routing kernel's align step
// builds (cuda/routing/align.cuh), in one launch of one CTA. An id outside [0, E) sets the
// status word (RoutingParams::error_flag) and its pair is dropped.
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
};

void launch_engine_dispatch(const EngineDispatchParams& p, cudaStream_t stream);

}  // namespace moekit::cuda
