// The prefill path's host entry (prefill.h): checks, the workspace's layout, six launches.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/prefill/prefill.h"
#include "cuda/prefill/prefill_gemm.h"
#include "cuda/prefill/prefill_kernels.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check_params(const PrefillParams& p) {
  MK_CHECK(p.max_tokens >= 1, "prefill: expected max_tokens >= 1, got " << p.max_tokens);
  MK_CHECK(p.tokens >= 1 && p.tokens <= p.max_tokens,
           "prefill: expected 1 <= tokens <= max_tokens (" << p.max_tokens << "), got "
                                                           << p.tokens);
  MK_CHECK(p.hidden >= 64 && p.hidden % 64 == 0,
           "prefill: expected hidden a positive multiple of 64, got " << p.hidden);
  MK_CHECK(p.inter >= 64 && p.inter % 64 == 0,
           "prefill: expected inter a positive multiple of 64, got " << p.inter);
  MK_CHECK(p.rows >= 1 && p.rows <= kPrefillMaxRows,
           "prefill: expected 1 <= rows <= " << kPrefillMaxRows << ", got " << p.rows);
  MK_CHECK(p.slots >= 1, "prefill: expected slots >= 1, got " << p.slots);
  MK_CHECK(prefill_tile_m_supported(p.tile_m),
           "prefill: expected tile_m 128 or 64, got " << p.tile_m);
  MK_CHECK(p.x != nullptr && p.ids != nullptr && p.weights != nullptr && p.w13 != nullptr &&
               p.w2 != nullptr && p.y != nullptr && p.workspace != nullptr,
           "prefill: x, ids, weights, w13, w2, y and workspace must be set");
  MK_CHECK((p.shared_partial == nullptr) == (p.shared_scale == nullptr),
           "prefill: shared_partial and shared_scale go together (one is null, the other not)");
  // (16-byte vector loads and stores of x, y, the biases and the shared partial; TMA operands)
  for (const void* ptr : {static_cast<const void*>(p.x), static_cast<const void*>(p.y),
                          static_cast<const void*>(p.w13), static_cast<const void*>(p.w2),
                          static_cast<const void*>(p.b13), static_cast<const void*>(p.b2),
                          static_cast<const void*>(p.shared_partial),
                          static_cast<const void*>(p.workspace)}) {
    MK_CHECK(ptr == nullptr || aligned16(ptr),
             "prefill: every device pointer must be 16-byte aligned, got " << ptr);
  }
}

}  // namespace

size_t prefill_workspace_bytes(int max_tokens, int slots, int rows, int hidden, int inter) {
  return prefill_carve(nullptr, max_tokens, slots, rows, hidden, inter).total_bytes;
}

bool prefill_supported(const char** why) { return prefill_gemm_supported(why); }

double prefill_expert_flops(int tokens, int slots, int hidden, int inter) {
  const double pairs = static_cast<double>(tokens) * slots;
  return 2.0 * pairs * (static_cast<double>(hidden) * 2 * inter + static_cast<double>(inter) * hidden);
}

void launch_prefill_experts(const PrefillParams& p, cudaStream_t stream) {
  check_params(p);
  const PrefillWorkspace ws =
      prefill_carve(p.workspace, p.max_tokens, p.slots, p.rows, p.hidden, p.inter);
  MK_CHECK(p.workspace_bytes >= ws.total_bytes,
           "prefill: workspace of " << p.workspace_bytes << " bytes, expected at least "
                                    << ws.total_bytes << " (prefill_workspace_bytes)");
  auto gemm = [&](const PrefillGroupArrays& arrays, int n, void* gemm_workspace) {
    if (p.gemm == PrefillGemm::Naive) {
      run_prefill_gemm_naive(arrays, p.rows, n, stream);
    } else {
      run_prefill_gemm(arrays, p.rows, p.tile_m, gemm_workspace, stream);
    }
  };
  launch_prefill_plan(p, ws, stream);
  launch_prefill_permute(p, ws, stream);
  gemm(ws.gate_up, 2 * p.inter, ws.gemm_workspace[0]);
  launch_prefill_activation(p, ws, stream);
  gemm(ws.down, p.hidden, ws.gemm_workspace[1]);
  launch_prefill_combine(p, ws, stream);
}

}  // namespace moekit::cuda
