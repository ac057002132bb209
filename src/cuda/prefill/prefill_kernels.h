// The prefill path's own kernels around its two grouped GEMMs (prefill_kernels.cu): plan,
// permute, activation, combine (prefill.h's steps 1, 2, 4, 6), and the workspace they share.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/prefill/prefill.h"
#include "cuda/prefill/prefill_gemm.h"
#include "cuda/prefill/prefill_gemm_fp8.h"

namespace moekit::cuda {

// The path's device buffers, carved from one workspace (prefill_carve). P = max_tokens x slots.
// The bf16 path uses xs, h and the bf16 group arrays; the fp8 path (fp8 block-scale weights)
// uses xq / xq_scale, hq / hq_scale and the fp8 group arrays instead (the others are null).
struct PrefillWorkspace {
  int* pos_of_pair = nullptr;   // [P]: the permuted row of pair q, or -1 (id out of range)
  int* row_expert = nullptr;    // [P]: the expert of permuted row r (written with expert biases)
  int* total_rows = nullptr;    // [1]: the valid pairs (rows of xs)
  int* plan_counts = nullptr;   // [plan_ctas, rows]: the plan's per-range expert counts
  int plan_ctas = 0;            // the CTA ranges the plan may split max_tokens x slots pairs into
  __nv_bfloat16* xs = nullptr;  // [P, H] permuted x
  __nv_bfloat16* gu = nullptr;  // [P, 2I] gate/up GEMM output
  __nv_bfloat16* h = nullptr;   // [P, I] activation
  __nv_bfloat16* partial = nullptr;       // [P, H] down GEMM output (unweighted, no bias)
  PrefillGroupArrays gate_up, down;       // [rows] each
  uint8_t* xq = nullptr;                  // [P, H] e4m3: permuted x, quantised per 128 channels
  float* xq_scale = nullptr;              // [P, H/128]
  uint8_t* hq = nullptr;                  // [P, I] e4m3: the activation, quantised per 128 channels
  float* hq_scale = nullptr;              // [P, I/128]
  PrefillFp8GroupArrays gate_up8, down8;  // [rows] each
  __nv_bfloat16* mx_weights = nullptr;    // MX: [mx_chunk, max(2I H, H I)] widened matrices
  void* gemm_workspace[2] = {nullptr, nullptr};
  size_t gemm_workspace_bytes = 0;
  size_t total_bytes = 0;  // the whole carve
};

// Lays the workspace out from `base` (null: sizes only, total_bytes set); fp8: the fp8 path's;
// mx_chunk > 0: the bf16 path's with mx_weights for that many experts.
PrefillWorkspace prefill_carve(void* base, int max_tokens, int slots, int rows, int hidden,
                               int inter, bool fp8, int mx_chunk);

// Step 1 (prefill_plan.cu), two launches over prefill_plan_ctas(pairs) CTA ranges of the pairs:
// counts, offsets, the stable permutation and both GEMMs' group arrays (MX: group e's weights at
// mx_weights + (e % mx_chunk) matrices, where its run widens them).
void launch_prefill_plan(const PrefillParams& p, const PrefillWorkspace& ws, cudaStream_t stream);
// The plan's CTA ranges for `pairs` pairs: one per kPrefillPlanPairsPerCta, 1 to
// kPrefillPlanMaxCtas.
int prefill_plan_ctas(long long pairs);
constexpr int kPrefillPlanPairsPerCta = 2048;
constexpr int kPrefillPlanMaxCtas = 32;
// Step 2: xs[pos_of_pair[q]] = x[q / slots] for every pair q (in pair order).
void launch_prefill_permute(const PrefillParams& p, const PrefillWorkspace& ws,
                            cudaStream_t stream);
// Step 2 of the fp8 path (prefill_kernels_fp8.cu): xq[pos_of_pair[q]] = e4m3(x[q / slots] / s)
// per 128 channels, xq_scale[pos][b] = s, the rule of cpu_reference::quantize_activation_fp8.
void launch_prefill_permute_fp8(const PrefillParams& p, const PrefillWorkspace& ws,
                                cudaStream_t stream);
// Step 4 of the fp8 path: the activation of launch_prefill_activation, in fp32, quantised per
// 128 columns into hq / hq_scale by the same rule.
void launch_prefill_activation_fp8(const PrefillParams& p, const PrefillWorkspace& ws,
                                   cudaStream_t stream);
// Step 4: h[r] = act(gu[r] gate half + b13, up half + b13) for r < total_rows.
void launch_prefill_activation(const PrefillParams& p, const PrefillWorkspace& ws,
                               cudaStream_t stream);
// Step 6: y[t] from the partials of its slots, in slot order (+ the shared partial).
void launch_prefill_combine(const PrefillParams& p, const PrefillWorkspace& ws,
                            cudaStream_t stream);

// Largest E + S the plan counts (its shared-memory counters).
constexpr int kPrefillMaxRows = 2048;

}  // namespace moekit::cuda
