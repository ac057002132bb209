// GpuMoeLayer::Impl's workspace (layer_impl.h), sized once for max_tokens, and the preparation
// of the kernels a forward launches, all outside any graph capture: a forward never allocates.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/experts/experts.h"
#include "cuda/layer/layer_impl.h"
#include "cuda/prefill/prefill.h"
#include "cuda/router_gemm/router_gemm.h"
#include "moekit/error.h"
#include "plan/expert_rules.h"

namespace moekit::cuda {
namespace {
int ceil_div(int a, int b) { return (a + b - 1) / b; }
}  // namespace

void GpuMoeLayer::Impl::allocate_workspace() {
  const int tm = opt.max_tokens;
  const int max_slots = K + S;
  const size_t pairs = static_cast<size_t>(tm) * max_slots;
  max_tasks = max_routed_tasks(static_cast<int>(pairs), rows_fused(), 8);
  size_t& ws = workspace_bytes;
  allocate<float>(logits, static_cast<size_t>(tm) * cols, ws);
  allocate<int32_t>(ids, pairs, ws);
  allocate<float>(weights, pairs, ws);
  allocate<float>(shared_scale, tm, ws);
  allocate<int>(pair_list, pairs, ws);
  allocate<ExpertTask>(tasks, max_tasks, ws);
  allocate<ExpertTask>(shared_tasks, ceil_div(tm, 8), ws);
  allocate<int>(pair_identity, tm, ws);
  allocate<__nv_bfloat16>(h, pairs * I, ws);
  allocate<float>(partial, pairs * H, ws);
  if (has_shared) {
    allocate<__nv_bfloat16>(shared_h, static_cast<size_t>(tm) * Is, ws);
    allocate<float>(shared_partial, static_cast<size_t>(tm) * H, ws);
  }
  allocate<DispatchCounters>(counters, 1, ws);
  allocate<int>(tile_counters, H / 16 + 1, ws);  // + the down tail's CTAs done
  allocate<int>(error_flag, 1, ws);
  allocate<__nv_bfloat16>(x_in, static_cast<size_t>(tm) * H, ws);
  allocate<__nv_bfloat16>(y_out, static_cast<size_t>(tm) * H, ws);
  // (tasks are read ahead of the task count: task_capacity)
  MK_CUDA_CHECK(cudaMemsetAsync(tasks.ptr, 0, tasks.bytes, stream));
  MK_CUDA_CHECK(cudaMemsetAsync(shared_tasks.ptr, 0, shared_tasks.bytes, stream));
  MK_CUDA_CHECK(cudaMemsetAsync(counters.ptr, 0, counters.bytes, stream));
  MK_CUDA_CHECK(cudaMemsetAsync(tile_counters.ptr, 0, tile_counters.bytes, stream));
  MK_CUDA_CHECK(cudaMemsetAsync(error_flag.ptr, 0, error_flag.bytes, stream));
  std::vector<int> identity(tm);
  for (int i = 0; i < tm; ++i) identity[i] = i;
  MK_CUDA_CHECK(cudaMemcpyAsync(pair_identity.ptr, identity.data(), tm * sizeof(int),
                                cudaMemcpyHostToDevice, stream));
}

void GpuMoeLayer::Impl::prepare_kernels() {
  prepare_expert_kernels();
  // The prefill path's workspace, where the plan takes that path at max_tokens (its rule holds
  // from a token count on) or it is forced.
  const plan::LayerPlan at_max =
      plan::plan_layer(spec, opt.max_tokens, FuseShared::Auto, opt.overrides, device);
  const bool grouped = at_max.stream == plan::Stream::Grouped;
  if (grouped) {
    const char* why = "";
    MK_CHECK(prefill_supported(&why), "the plan takes the prefill path: " << why);
    const size_t bytes = prefill_workspace_bytes(opt.max_tokens, K + S, E + S, H, I);
    allocate<unsigned char>(prefill_workspace, bytes, workspace_bytes);
  }
  // The dense shared MLP's cuBLAS handle and buffers, where a forward up to max_tokens uses it
  // (the prefill path runs an unfused shared MLP so too).
  const int dense_from = opt.overrides.shared_dense_tokens >= 0 ? opt.overrides.shared_dense_tokens
                                                                : plan::kSharedDenseTokens;
  if (has_shared && ((dense_from > 0 && dense_from <= opt.max_tokens) || grouped)) {
    shared_dense = std::make_unique<SharedDenseMlp>(opt.max_tokens, H, Is);
  }
  warm_up_router_gemm(spec, opt.max_tokens, stream);
}

}  // namespace moekit::cuda
