// GpuMoeLayer::Impl (include/moekit/cuda_layer.h): what one layer holds on the GPU and the three
// parts that use it, one file each:
//   layer_weights.cu    the stacked weights: allocation, upload, the device random fill and the
//                       fused shared slots repacked on the device
//   layer_workspace.cu  the workspace sized for max_tokens, the kernels' preparation (residency,
//                       shared-memory limits, the router GEMM's warm-up, the dense shared MLP)
//   layer_forward.cu    a forward: its plan (src/plan/, cached per token count) -> parameters ->
//                       launches, no host synchronisation (capturable in a CUDA graph)
// Weights on the device: stacked w13 [E+S, 2I, H], w2 [E+S, H, I] (slots repacked from the
// shared MLP as in src/io/lazy_experts.h), biases [E+S, 2I] / [E+S, H] (zero for the slots), and
// the unfused shared MLP [2Is, H] / [H, Is].
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <optional>
#include <unordered_map>

#include "cuda/common/device_buffer.h"
#include "cuda/layer/shared_dense.h"
#include "cuda/routing/routing.h"
#include "moekit/cuda_layer.h"
#include "moekit/plan.h"

namespace moekit::cuda {

struct GpuMoeLayer::Impl {
  MoeSpec spec;
  int layer = 0;
  GpuLayerOptions opt;
  plan::DeviceInfo device;  // the live GPU's facts for the plan
  int E = 0, S = 0, H = 0, I = 0, Is = 0, K = 0, cols = 0;
  bool has_shared = false;
  bool can_fuse = false;
  RoutingConfig cfg_fused, cfg_unfused;
  cudaStream_t stream = nullptr;
  std::unique_ptr<SharedDenseMlp> shared_dense;  // the unfused shared MLP's cuBLAS GEMMs
  unsigned long long* trace = nullptr;           // set_trace: kernel timeline words, or null
  // plans by (tokens, fusion asked for): planned once, outside any graph capture's hot path
  mutable std::unordered_map<long long, plan::LayerPlan> plans;

  // weights
  size_t weight_bytes = 0;
  DeviceBuffer router_w, router_bias, corr_bias, w13, w2, b13, b2, shared_w13, shared_w2;
  // workspace
  size_t workspace_bytes = 0;
  DeviceBuffer logits, ids, weights, shared_scale, pair_list, tasks, shared_tasks, pair_identity;
  DeviceBuffer h, shared_h, partial, shared_partial, counters, tile_counters;
  DeviceBuffer error_flag;
  DeviceBuffer x_in, y_out;
  DeviceBuffer prefill_workspace;  // the prefill path's, where a plan up to max_tokens takes it
  int max_tasks = 0;

  ~Impl();

  int rows_fused() const { return E + (can_fuse ? S : 0); }

  // layer.cu
  void init_shapes();
  void validate() const;
  // layer_weights.cu
  void allocate_weights();
  void repack_slots_on_device();
  void upload(const LayerWeights& w);
  void fill_random(uint64_t seed);
  // layer_workspace.cu
  void allocate_workspace();
  void prepare_kernels();
  // layer_forward.cu
  const plan::LayerPlan& plan_for(int tokens, FuseShared fuse) const;
  void forward_device(const void* x, void* y, int tokens, FuseShared fuse, cudaStream_t st);
  void forward_grouped(const plan::LayerPlan& pl, const void* x, void* y, cudaStream_t st);
};

}  // namespace moekit::cuda
