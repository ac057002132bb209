// GpuMoeLayer::Impl's workspace (layer_impl.h), sized once for max_tokens as pieces of one
// buffer (the layer's own, or an engine's: moekit/moe.h), and the preparation of the kernels a
// forward launches, all outside any graph capture: a forward never allocates.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>
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

size_t GpuMoeLayer::Impl::carve_workspace(void* base, LayerWorkspace* out) const {
  const size_t tm = opt.max_tokens;
  const size_t pairs = tm * (K + S);
  const int tasks_cap = max_routed_tasks(static_cast<int>(pairs), rows_fused(), 8);
  size_t at = 0;
  LayerWorkspace w;
  // each piece 256-byte aligned (the kernels' 16-byte loads, cuBLAS's operands)
  auto take = [&](auto*& ptr, size_t count) {
    using T = std::remove_pointer_t<std::remove_reference_t<decltype(ptr)>>;
    at = (at + 255) / 256 * 256;
    ptr = base != nullptr && count > 0 ? reinterpret_cast<T*>(static_cast<char*>(base) + at)
                                       : nullptr;
    at += count * sizeof(T);
  };
  take(w.status, 1);
  take(w.logits, tm * cols);
  take(w.ids, pairs);
  take(w.weights, pairs);
  take(w.shared_scale, tm);
  take(w.pair_list, pairs);
  take(w.tasks, tasks_cap);
  take(w.shared_tasks, ceil_div(static_cast<int>(tm), 8));
  take(w.pair_identity, tm);
  take(w.shared_h, has_shared ? tm * Is : 0);
  take(w.shared_partial, has_shared ? tm * H : 0);
  take(w.counters, 1);
  take(w.tile_counters, H / 16 + 1);  // + the down tail's CTAs done
  take(w.topk_ids, tm * K);
  take(w.topk_weights, tm * K);
  // The decode kernels' h and partials and the prefill path's workspace share one region: a
  // forward runs its experts on one or the other (plan::LayerPlan::stream).
  const size_t shared_region = (at + 255) / 256 * 256;
  take(w.h, pairs * I);
  take(w.partial, pairs * H);
  take(w.x8, fp8 ? tm * H : 0);
  take(w.x8_scale, fp8 ? tm * H / 128 : 0);
  take(w.h8, fp8 ? pairs * I : 0);
  take(w.h8_scale, fp8 ? pairs * I / 128 : 0);
  const size_t decode_end = at;
  at = shared_region;
  unsigned char* prefill = nullptr;
  take(prefill, prefill_bytes);
  w.prefill = prefill;
  w.prefill_bytes = prefill_bytes;
  at = std::max(at, decode_end);
  at = (at + 255) / 256 * 256;
  if (out != nullptr) *out = w;
  return at;
}

namespace {

// pair_identity[i] = i: the unfused shared MLP's pair list (every token one pair)
__global__ void write_identity(int* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = i;
  }
}

}  // namespace

void GpuMoeLayer::Impl::init_workspace(const LayerWorkspace& w, cudaStream_t st) const {
  const size_t tm = opt.max_tokens;
  const size_t pairs = tm * (K + S);
  const int tasks_cap = max_routed_tasks(static_cast<int>(pairs), rows_fused(), 8);
  // (tasks are read ahead of the task count: task_capacity)
  MK_CUDA_CHECK(cudaMemsetAsync(w.tasks, 0, tasks_cap * sizeof(ExpertTask), st));
  MK_CUDA_CHECK(cudaMemsetAsync(w.shared_tasks, 0, ceil_div(static_cast<int>(tm), 8) *
                                                       sizeof(ExpertTask), st));
  MK_CUDA_CHECK(cudaMemsetAsync(w.counters, 0, sizeof(DispatchCounters), st));
  MK_CUDA_CHECK(cudaMemsetAsync(w.tile_counters, 0, (H / 16 + 1) * sizeof(int), st));
  MK_CUDA_CHECK(cudaMemsetAsync(w.status, 0, sizeof(int), st));
  write_identity<<<ceil_div(static_cast<int>(tm), 256), 256, 0, st>>>(w.pair_identity,
                                                                       static_cast<int>(tm));
  MK_CUDA_CHECK(cudaGetLastError());
}

void GpuMoeLayer::Impl::allocate_workspace() {
  const size_t bytes = carve_workspace(nullptr, nullptr);
  workspace_buf = DeviceBuffer(bytes);
  workspace_bytes = bytes;
  carve_workspace(workspace_buf.ptr, &ws);
  init_workspace(ws, stream);
  allocate<__nv_bfloat16>(x_in, static_cast<size_t>(opt.max_tokens) * H, workspace_bytes);
  allocate<__nv_bfloat16>(y_out, static_cast<size_t>(opt.max_tokens) * H, workspace_bytes);
}

plan::LayerPlan GpuMoeLayer::Impl::plan_at_max() const {
  return plan::plan_layer(spec, opt.max_tokens, FuseShared::Auto, opt.overrides, device,
                          opt.expert_dtype, opt.mx_format);
}

bool GpuMoeLayer::Impl::grouped_at_max() const {
  // The prefill path's workspace, where the plan takes that path at max_tokens (its rule holds
  // from a token count on) or it is forced.
  return plan_at_max().stream == plan::Stream::Grouped;
}

size_t GpuMoeLayer::Impl::prefill_bytes_needed() const {
  const plan::LayerPlan at_max = plan_at_max();
  if (at_max.stream != plan::Stream::Grouped) return 0;
  const char* why = "";
  MK_CHECK(prefill_supported(&why), "the plan takes the prefill path: " << why);
  // (MX: the widening's run of experts does not depend on the token count)
  return prefill_workspace_bytes(opt.max_tokens, K + S, E + S, H, I, fp8, at_max.grouped_mx_chunk);
}

void GpuMoeLayer::Impl::prepare_kernels() {
  prepare_expert_kernels();
  const bool grouped = grouped_at_max();
  prefill_bytes = prefill_bytes_needed();
  // The dense shared MLP's cuBLAS handle and buffers, where a forward up to max_tokens uses it
  // (the prefill path runs an unfused shared MLP so too).
  const int dense_from = opt.overrides.shared_dense_tokens >= 0 ? opt.overrides.shared_dense_tokens
                                                                : plan::kSharedDenseTokens;
  // (fp8 and MX: the shared expert runs as fused slots only)
  if (has_shared && !quantised() && ((dense_from > 0 && dense_from <= opt.max_tokens) || grouped)) {
    shared_dense = std::make_unique<SharedDenseMlp>(opt.max_tokens, H, Is);
  }
  warm_up_router_gemm(spec, opt.max_tokens, stream);
}

}  // namespace moekit::cuda
