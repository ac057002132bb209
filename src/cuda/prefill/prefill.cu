// The prefill path's host entry (prefill.h): checks, the workspace's layout, seven launches.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "cuda/common/cuda_check.h"
#include "cuda/prefill/prefill.h"
#include "cuda/prefill/prefill_gemm.h"
#include "cuda/prefill/prefill_gemm_fp8.h"
#include "cuda/prefill/prefill_kernels.h"
#include "cuda/prefill/prefill_mx.h"
#include "moekit/error.h"
#include "moekit/plan.h"

namespace moekit::cuda {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The fp8 block-scale weights (w13_fp8 set): every fp8 field, no bf16 weight, 128-multiple
// shapes (one scale per whole 128 x 128 tile; the GEMM's scale blocks), TMA-aligned bytes.
void check_fp8_params(const PrefillParams& p) {
  MK_CHECK(p.w13 == nullptr && p.w2 == nullptr,
           "prefill: w13_fp8 is set, so w13 and w2 must be null (bf16 or fp8 weights, not both)");
  MK_CHECK(p.w13_scale != nullptr && p.w2_fp8 != nullptr && p.w2_scale != nullptr,
           "prefill: fp8 weights need w13_fp8, w13_scale, w2_fp8 and w2_scale, got w13_scale "
               << p.w13_scale << ", w2_fp8 " << static_cast<const void*>(p.w2_fp8) << ", w2_scale "
               << p.w2_scale);
  MK_CHECK(p.hidden % kPrefillFp8Block == 0, "prefill: fp8 weights need hidden a multiple of "
                                                 << kPrefillFp8Block << ", got " << p.hidden);
  MK_CHECK(p.inter % kPrefillFp8Block == 0, "prefill: fp8 weights need inter a multiple of "
                                                << kPrefillFp8Block << ", got " << p.inter);
  for (const void* ptr :
       {static_cast<const void*>(p.w13_fp8), static_cast<const void*>(p.w2_fp8)}) {
    MK_CHECK(aligned16(ptr), "prefill: fp8 weights must be 16-byte aligned, got " << ptr);
  }
  for (const void* ptr :
       {static_cast<const void*>(p.w13_scale), static_cast<const void*>(p.w2_scale)}) {
    MK_CHECK(reinterpret_cast<uintptr_t>(ptr) % 4 == 0,
             "prefill: fp8 weight scales must be 4-byte aligned, got " << ptr);
  }
}

// The MX weights (mx set): every MX field, no bf16 or fp8 weight, a chunk of experts.
void check_mx_params(const PrefillParams& p) {
  MK_CHECK(p.mx == ExpertFormat::Mxfp4 || p.mx == ExpertFormat::Mxfp8,
           "prefill: expected mx Bf16, Mxfp4 or Mxfp8, got " << expert_format_name(p.mx));
  MK_CHECK(p.w13 == nullptr && p.w2 == nullptr && p.w13_fp8 == nullptr,
           "prefill: mx is " << expert_format_name(p.mx)
                             << ", so w13, w2 and w13_fp8 must be null (one format of weights)");
  MK_CHECK(p.w13_mx != nullptr && p.w13_mx_scale != nullptr && p.w2_mx != nullptr &&
               p.w2_mx_scale != nullptr,
           "prefill: MX weights need w13_mx, w13_mx_scale, w2_mx and w2_mx_scale");
  MK_CHECK(aligned16(p.w13_mx) && aligned16(p.w2_mx),
           "prefill: MX weights must be 16-byte aligned, got "
               << static_cast<const void*>(p.w13_mx) << " and "
               << static_cast<const void*>(p.w2_mx));
  MK_CHECK((p.mx_chunk >= 1 && p.mx_tile_m == 0) ||
               (p.mx_chunk == 0 && (p.mx_tile_m == 64 || p.mx_tile_m == 128)),
           "prefill: MX weights need mx_chunk >= 1 (widened) or mx_tile_m 64 or 128 (the packed "
           "GEMM), got mx_chunk "
               << p.mx_chunk << ", mx_tile_m " << p.mx_tile_m);
}

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
  MK_CHECK(p.x != nullptr && p.ids != nullptr && p.weights != nullptr && p.y != nullptr &&
               p.workspace != nullptr,
           "prefill: x, ids, weights, y and workspace must be set");
  if (p.gemm == PrefillGemm::Cutlass) {
    const bool fp8 = p.w13_fp8 != nullptr && p.mx == ExpertFormat::Bf16;
    const auto kernels = plan::grouped_gemm_kernels();
    for (const auto& [row, what] : {std::pair{p.gate_up_gemm, "gate_up_gemm"},
                                    std::pair{p.down_gemm, "down_gemm"}}) {
      MK_CHECK(row >= 0 && row < static_cast<int>(kernels.size()),
               "prefill: expected " << what << " a grouped GEMM instance in [0, "
                                    << kernels.size() << "), got " << row);
      MK_CHECK(kernels[row].fp8 == fp8, "prefill: " << what << " " << kernels[row].name
                                                    << " takes " << (fp8 ? "bf16" : "fp8")
                                                    << " operands; the weights are "
                                                    << (fp8 ? "fp8" : "bf16 or MX"));
    }
  }
  if (p.mx != ExpertFormat::Bf16) {
    check_mx_params(p);
  } else if (p.w13_fp8 != nullptr) {
    check_fp8_params(p);
  } else {
    MK_CHECK(p.w13 != nullptr && p.w2 != nullptr,
             "prefill: expected bf16 weights (w13 and w2) or fp8 ones (w13_fp8, ...), got "
                 << (p.w13 != nullptr ? "w13" : "no w13") << " and "
                 << (p.w2 != nullptr ? "w2" : "no w2"));
    MK_CHECK(p.w13_scale == nullptr && p.w2_fp8 == nullptr && p.w2_scale == nullptr,
             "prefill: fp8 fields set without w13_fp8 (w13_scale, w2_fp8 or w2_scale)");
  }
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

size_t prefill_workspace_bytes(int max_tokens, int slots, int rows, int hidden, int inter, bool fp8,
                               int mx_chunk) {
  return prefill_carve(nullptr, max_tokens, slots, rows, hidden, inter, fp8, mx_chunk).total_bytes;
}

bool prefill_supported(const char** why) { return prefill_gemm_supported(why); }

double prefill_expert_flops(int tokens, int slots, int hidden, int inter) {
  const double pairs = static_cast<double>(tokens) * slots;
  return 2.0 * pairs * (static_cast<double>(hidden) * 2 * inter + static_cast<double>(inter) * hidden);
}

namespace {

// The arrays of groups [first, ...) of a grouped GEMM.
PrefillGroupArrays group_range(const PrefillGroupArrays& g, int first) {
  return {g.problems + first, g.a + first,        g.b + first,       g.d + first,
          g.stride_a + first, g.stride_b + first, g.stride_d + first};
}

}  // namespace

void launch_prefill_experts(const PrefillParams& p, cudaStream_t stream) {
  check_params(p);
  const bool fp8 = p.w13_fp8 != nullptr, mx = p.mx != ExpertFormat::Bf16;
  const int mx_chunk = mx ? p.mx_chunk : 0;
  const PrefillWorkspace ws =
      prefill_carve(p.workspace, p.max_tokens, p.slots, p.rows, p.hidden, p.inter, fp8, mx_chunk);
  MK_CHECK(p.workspace_bytes >= ws.total_bytes,
           "prefill: workspace of " << p.workspace_bytes << " bytes, expected at least "
                                    << ws.total_bytes << " (prefill_workspace_bytes, fp8 "
                                    << (fp8 ? "true" : "false") << ", mx_chunk " << mx_chunk
                                    << ")");
  // `kernel`: p.gate_up_gemm or p.down_gemm
  auto gemm = [&](const PrefillGroupArrays& arrays, int groups, int n, int kernel,
                  void* gemm_workspace) {
    if (p.gemm == PrefillGemm::Naive) {
      run_prefill_gemm_naive(arrays, groups, n, stream);
    } else {
      run_prefill_gemm(arrays, groups, kernel, gemm_workspace, stream);
    }
  };
  auto gemm_fp8 = [&](const PrefillFp8GroupArrays& arrays, int n, int kernel,
                      void* gemm_workspace) {
    if (p.gemm == PrefillGemm::Naive) {
      run_prefill_gemm_fp8_naive(arrays, p.rows, n, stream);
    } else {
      run_prefill_gemm_fp8(arrays, p.rows, kernel, gemm_workspace, stream);
    }
  };
  // MX: the packed GEMM, or each run of mx_chunk experts widened into mx_weights, then the
  // GEMM of its groups
  auto gemm_mx = [&](const MxMatrices& m, const PrefillGroupArrays& arrays, int n, int kernel,
                     void* gemm_workspace) {
    if (mx_chunk == 0) {
      run_prefill_gemm_mx(m, arrays, p.rows, p.mx_tile_m, stream);
      return;
    }
    for (int first = 0; first < p.rows; first += mx_chunk) {
      const int groups = std::min(mx_chunk, p.rows - first);
      launch_mx_widen(m, first, groups, arrays.problems, ws.mx_weights, stream);
      gemm(group_range(arrays, first), groups, n, kernel, gemm_workspace);
    }
  };
  launch_prefill_plan(p, ws, stream);
  if (fp8) {
    launch_prefill_permute_fp8(p, ws, stream);
    gemm_fp8(ws.gate_up8, 2 * p.inter, p.gate_up_gemm, ws.gemm_workspace[0]);
    launch_prefill_activation_fp8(p, ws, stream);
    gemm_fp8(ws.down8, p.hidden, p.down_gemm, ws.gemm_workspace[1]);
  } else if (mx) {
    launch_prefill_permute(p, ws, stream);
    gemm_mx({p.mx, true, 2 * p.inter, p.hidden, p.w13_mx, p.w13_mx_scale}, ws.gate_up, 2 * p.inter,
            p.gate_up_gemm, ws.gemm_workspace[0]);
    launch_prefill_activation(p, ws, stream);
    gemm_mx({p.mx, false, p.hidden, p.inter, p.w2_mx, p.w2_mx_scale}, ws.down, p.hidden,
            p.down_gemm, ws.gemm_workspace[1]);
  } else {
    launch_prefill_permute(p, ws, stream);
    gemm(ws.gate_up, p.rows, 2 * p.inter, p.gate_up_gemm, ws.gemm_workspace[0]);
    launch_prefill_activation(p, ws, stream);
    gemm(ws.down, p.rows, p.hidden, p.down_gemm, ws.gemm_workspace[1]);
  }
  launch_prefill_combine(p, ws, stream);
}

}  // namespace moekit::cuda
