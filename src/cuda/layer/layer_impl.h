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
// the unfused shared MLP [2Is, H] / [H, Is]. A forward reads them through LayerWeightPtrs and
// writes a LayerWorkspace, so the engine API (src/cuda/engine/) runs the same Impl on an
// engine's borrowed weights and workspace.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <optional>
#include <unordered_map>

#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "cuda/common/device_guard.h"
#include "cuda/layer/shared_dense.h"
#include "cuda/routing/routing.h"
#include "moekit/cuda_layer.h"
#include "moekit/plan.h"

namespace moekit::cuda {

// The weights a forward reads: the layer's own buffers, or an engine's borrowed ones
// (moekit/moe.h: MoeWeightsView, the same layout). w13/w2 hold E routed experts, then the S fused
// slots where a fused forward runs.
struct LayerWeightPtrs {
  const void* router_w = nullptr;          // [cols, H] bf16 or fp32
  const float* router_bias = nullptr;      // [E] or null
  const float* corr_bias = nullptr;        // [E] or null
  const __nv_bfloat16* w13 = nullptr;      // [E(+S), 2I, H]
  const __nv_bfloat16* w2 = nullptr;       // [E(+S), H, I]
  const float* b13 = nullptr;              // [E(+S), 2I] or null
  const float* b2 = nullptr;               // [E(+S), H] or null
  const __nv_bfloat16* shared_w13 = nullptr;  // [2Is, H] or null
  const __nv_bfloat16* shared_w2 = nullptr;   // [H, Is] or null
  // fp8 block-scale experts (the layer holds F8_E4M3 experts: set instead of w13 / w2): e4m3
  // bytes and the fp32 multiplier of each 128 x 128 tile, the tile grids row-major per expert
  // (I % 128 == 0 and H % 128 == 0, so w13's grid is gate tiles then up tiles)
  const uint8_t* w13_fp8 = nullptr;    // [E(+S), 2I, H]
  const float* w13_scale = nullptr;    // [E(+S), 2I/128, H/128]
  const uint8_t* w2_fp8 = nullptr;     // [E(+S), H, I]
  const float* w2_scale = nullptr;     // [E(+S), H/128, I/128]
  // MX experts (the layer holds Mxfp4 / Mxfp8 experts: set instead of w13 / w2): the packed rows
  // and their e8m0 bytes in the MX kernels' layout (cuda/experts/experts_mx_layout.h)
  const uint8_t* w13_mx = nullptr;        // [E(+S), 2I, mx_row_bytes(H)]
  const uint8_t* w13_mx_scale = nullptr;  // [E(+S), mx_scale_layout_bytes(2I, H)]
  const uint8_t* w2_mx = nullptr;         // [E(+S), H, mx_row_bytes(I)]
  const uint8_t* w2_mx_scale = nullptr;   // [E(+S), mx_scale_layout_bytes(H, I)]
};

// The workspace of a forward up to max_tokens, pieces of one buffer (Impl::carve_workspace);
// the status word first, so that a caller reads it without knowing the rest.
struct LayerWorkspace {
  int* status = nullptr;  // bit 0: an expert id outside [0, rows) reached the dispatch
  float* logits = nullptr;
  int32_t* ids = nullptr;
  float* weights = nullptr;
  float* shared_scale = nullptr;
  int* pair_list = nullptr;
  ExpertTask* tasks = nullptr;
  ExpertTask* shared_tasks = nullptr;
  int* pair_identity = nullptr;
  __nv_bfloat16* h = nullptr;
  __nv_bfloat16* shared_h = nullptr;
  // fp8 bulk kernels: x [T, H] and h [pairs, I] in e4m3 with their [., k/128] scales
  uint8_t* x8 = nullptr;
  float* x8_scale = nullptr;
  uint8_t* h8 = nullptr;
  float* h8_scale = nullptr;
  float* partial = nullptr;
  float* shared_partial = nullptr;
  DispatchCounters* counters = nullptr;
  int* tile_counters = nullptr;
  void* prefill = nullptr;  // the prefill path's, where a plan up to max_tokens takes it
  size_t prefill_bytes = 0;
  // the engine API's: a routing of [T, k] before its expansion
  int32_t* topk_ids = nullptr;
  float* topk_weights = nullptr;
};

struct GpuMoeLayer::Impl {
  MoeSpec spec;
  int layer = 0;
  GpuLayerOptions opt;
  plan::DeviceInfo device;  // the live GPU's facts for the plan
  int E = 0, S = 0, H = 0, I = 0, Is = 0, K = 0, cols = 0;
  bool has_shared = false;
  bool can_fuse = false;
  bool fp8 = false;  // the experts held as fp8 block-scale (GpuLayerOptions::expert_dtype)
  ExpertFormat mx = ExpertFormat::Bf16;  // Mxfp4 / Mxfp8: MX experts (GpuLayerOptions::mx_format)
  RoutingConfig cfg_fused, cfg_unfused;
  cudaStream_t stream = nullptr;                 // preparation (uploads, warm-up, memsets)
  std::unique_ptr<SharedDenseMlp> shared_dense;  // the unfused shared MLP's cuBLAS GEMMs
  unsigned long long* trace = nullptr;           // set_trace: kernel timeline words, or null
  // false: a forward leaves the shared expert out (the engine API's experts() without it)
  bool add_shared = true;
  // The routed experts the weight stacks hold as rows 0..slice_count-1 (then the fused slots):
  // E for the owning layer; an engine's expert slice (src/cuda/engine/) holds fewer.
  int slice_count = 0;
  // true: the dispatch (align step, prefill plan) drops the pairs outside the weight rows without
  // an error (an expert slice: the engine dispatch marks another rank's pairs -1 and reports the
  // ids outside [0, E) itself); false: such a pair sets ws.status.
  bool drops_pairs = false;
  // plans by (tokens, fusion asked for, self-routing allowed): planned once, outside any graph
  // capture's hot path
  mutable std::unordered_map<long long, plan::LayerPlan> plans;

  // what a forward reads and writes (the buffers below, or an engine's)
  LayerWeightPtrs wp;
  LayerWorkspace ws;

  // the owning layer's weights
  size_t weight_bytes = 0;
  DeviceBuffer router_w, router_bias, corr_bias, w13, w2, b13, b2, shared_w13, shared_w2;
  DeviceBuffer w13_fp8, w13_scale, w2_fp8, w2_scale;  // fp8: instead of w13, w2 and the shared MLP
  DeviceBuffer w13_mx, w13_mx_scale, w2_mx, w2_mx_scale;  // MX: the same
  // the owning layer's workspace (one buffer, carved), and its host forward's x and y
  size_t workspace_bytes = 0;
  DeviceBuffer workspace_buf;
  DeviceBuffer x_in, y_out;
  size_t prefill_bytes = 0;  // the prefill path's share of the workspace (prepare_kernels)
  int max_tasks = 0;

  ~Impl();

  int rows_fused() const { return E + (can_fuse ? S : 0); }
  // fp8: floats of one expert's tile scales (the 128 x 128 grids of w13 and w2)
  size_t scales13() const { return static_cast<size_t>(2 * I / 128) * (H / 128); }
  size_t scales2() const { return static_cast<size_t>(H / 128) * (I / 128); }
  bool mx_experts() const { return mx != ExpertFormat::Bf16; }
  bool quantised() const { return fp8 || mx_experts(); }  // no bf16 copy, the shared expert fused
  // MX: bytes of one expert's packed w13 / w2 and of their scales in the kernels' layout
  size_t mx13_bytes() const { return static_cast<size_t>(2) * I * mx_row_bytes(mx, H); }
  size_t mx2_bytes() const { return static_cast<size_t>(H) * mx_row_bytes(mx, I); }
  size_t mx13_scale_bytes() const;
  size_t mx2_scale_bytes() const;

  // layer.cu
  void init_shapes();
  void validate() const;
  // layer_weights.cu
  void allocate_weights();
  void point_at_own_weights();
  void repack_slots_on_device();
  void upload(const LayerWeights& w);
  void fill_random(uint64_t seed);
  // layer_workspace.cu
  plan::LayerPlan plan_at_max() const;  // the plan of a forward of max_tokens (Auto fusion)
  bool grouped_at_max() const;         // whether a plan up to max_tokens takes the prefill path
  size_t prefill_bytes_needed() const;  // that path's workspace (0 when not), current device
  void prepare_kernels();  // sets prefill_bytes: call before carve_workspace
  // The workspace's size (base null) or its pieces at `base` into *out: 256-byte aligned.
  size_t carve_workspace(void* base, LayerWorkspace* out) const;
  // Zeroes the counters, the task lists and the status, writes the identity pair list.
  void init_workspace(const LayerWorkspace& w, cudaStream_t st) const;
  void allocate_workspace();  // the owning layer's: one buffer, carved and initialised
  // layer_forward.cu
  const plan::LayerPlan& plan_for(int tokens, FuseShared fuse, bool self_route = true) const;
  void forward_device(const void* x, void* y, int tokens, FuseShared fuse, cudaStream_t st);
  // The pieces of a forward (forward_device is all three in order): the dense shared MLP where
  // the plan runs it; the router GEMM (x, or none when `logits` is given) and the routing +
  // dispatch; the expert launches (or the prefill path) from the dispatch's lists.
  void launch_dense_shared(const plan::LayerPlan& pl, const void* x, cudaStream_t st);
  RoutingParams routing_params(const plan::LayerPlan& pl) const;
  void launch_router_gemm(const plan::LayerPlan& pl, const void* x, cudaStream_t st);
  void launch_experts(const plan::LayerPlan& pl, const RoutingParams& rp, const void* x, void* y,
                      cudaStream_t st);
  void forward_grouped(const plan::LayerPlan& pl, const void* x, void* y, cudaStream_t st);
};

}  // namespace moekit::cuda
