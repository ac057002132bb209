// The prefill path of the GPU experts (compute-bound batches, hundreds to thousands of tokens) on
// sm_90a tensor cores: one host entry that takes the routing's ids and weights and runs
//
//   1. plan     (two launches, prefill_plan.cu) per-expert counts over the weight rows E+S,
//               their offsets, a stable permutation (pair q = t*slots + s -> row pos(q), rows
//               grouped by expert in expert order, pairs of one expert in pair order) and both
//               GEMMs' per-group problem sizes, pointers and strides, all on the device
//   2. permute  xs[pos(q)] = x[q / slots]: each expert's token rows contiguous
//   3. gate/up  grouped GEMM gu[n_e, 2I] = xs_e[n_e, H] . w13_e[2I, H]^T, bf16 (prefill_gemm.h)
//   4. act      h[n_e, I] = act(gate + b13, up + b13) in bf16 (SiLU*mul, the clamped variants)
//   5. down     grouped GEMM partial[n_e, H] = h_e[n_e, I] . w2_e[H, I]^T, bf16
//   6. combine  y[t] = sum_s w[t,s] * (partial[pos(t,s)] + b2[id]) in slot order
//               (+ shared_scale[t] * shared_partial[t]), bf16
//
// Both GEMMs accumulate in fp32 and round their outputs to bf16, as a bf16 Linear does (a bf16
// transformers forward rounds at the same points: the gate/up outputs, h, each expert's output);
// the activation and the combine compute in fp32 from them. The activation is its own launch (a
// fused epilogue needs the gate and up columns of an h column in one tile: w13's gate rows then up
// rows put them I columns apart).
//
// fp8 block-scale experts (w13_fp8 set: e4m3 weights, one fp32 scale per 128 x 128 tile) run
// W8A8 as the CPU reference does (reference_fp8.cpp, docs/decisions/fp8_experts.md):
//   2. permute  xq[pos(q)] = e4m3(x[q / slots] / s) per 128 channels, s = max(amax, 1e-4) / 448
//               (ue8m0: rounded up to a power of two), the scales [rows, H/128] beside it
//   3. gate/up  the fp8 grouped GEMM with 128-block scaling (prefill_gemm_fp8.h), bf16 out
//   4. act      h from the bf16 gate/up, rounded to bf16, quantised per 128 columns by the
//               same rule
//   5. down     the fp8 grouped GEMM, bf16 partials; steps 1 and 6 as above.
// It needs H and I multiples of 128.
//
// MX experts (mx Mxfp8 / Mxfp4: packed rows and e8m0 bytes in the MX kernels' layout) run
// W8A16 / W4A16 as the CPU reference does (reference_mx.cpp): each GEMM runs over runs of
// mx_chunk experts, the run's matrices first widened to their exact bf16 weights in the
// workspace (prefill_mx.h; experts without rows skipped), then the bf16 grouped GEMM of those
// groups; or (mx_tile_m) as one GEMM that reads the packed bytes itself (run_prefill_gemm_mx);
// the other steps as the bf16 path's.
//
// No host synchronisation: every size the host needs is the token count and the spec's shapes,
// so a CUDA graph can capture a launch. The result does not depend on the order of the pairs
// (each pair is its own GEMM row; the combine sums in slot order): bit-for-bit repeatable.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "moekit/expert_format.h"
#include "moekit/spec.h"

namespace moekit::cuda {

// Which grouped GEMM runs steps 3 and 5: the CUTLASS instance, or its naive twin (one thread per
// output element; the second reference, for tests).
enum class PrefillGemm { Cutlass, Naive };

struct PrefillParams {
  int tokens = 0;  // T, 1..max_tokens
  int hidden = 0;  // H, multiple of 64 (fp8 weights: of 128)
  int inter = 0;   // I of one expert (or fused shared slot), multiple of 64 (fp8: of 128)
  int rows = 0;    // weight rows E + S: the GEMMs' group count, ids' range
  int slots = 0;   // per token: top_k (+ fused shared slots)
  int max_tokens = 0;  // what `workspace` was sized for (prefill_workspace_bytes)

  const __nv_bfloat16* x = nullptr;  // [T, H]
  const int32_t* ids = nullptr;      // [T, slots] in [0, rows)
  const float* weights = nullptr;    // [T, slots]
  const __nv_bfloat16* w13 = nullptr;  // [rows, 2I, H]: gate rows [0, I), then up rows
  const __nv_bfloat16* w2 = nullptr;   // [rows, H, I]
  const float* b13 = nullptr;          // [rows, 2I] or null
  const float* b2 = nullptr;           // [rows, H] or null
  // fp8 block-scale experts, set instead of w13 / w2 (W8A8: x and h quantised per token per 128
  // channels; layout as LayerWeightPtrs' fp8 fields): e4m3 bytes, fp32 per 128 x 128 tile
  const uint8_t* w13_fp8 = nullptr;  // [rows, 2I, H]
  const float* w13_scale = nullptr;  // [rows, 2I/128, H/128]
  const uint8_t* w2_fp8 = nullptr;   // [rows, H, I]
  const float* w2_scale = nullptr;   // [rows, H/128, I/128]
  bool ue8m0 = false;                // activation scales rounded up to powers of two
  // MX experts, set instead of w13 / w2 (W8A16 / W4A16; layout as LayerWeightPtrs' mx fields)
  ExpertFormat mx = ExpertFormat::Bf16;   // Mxfp8 / Mxfp4
  const uint8_t* w13_mx = nullptr;        // [rows][2I * mx_row_bytes(H)]
  const uint8_t* w13_mx_scale = nullptr;  // [rows][mx_scale_layout_bytes(2I, H)]
  const uint8_t* w2_mx = nullptr;         // [rows][H * mx_row_bytes(I)]
  const uint8_t* w2_mx_scale = nullptr;   // [rows][mx_scale_layout_bytes(H, I)]
  int mx_chunk = 0;  // experts widened at a time: what `workspace` was sized for, or fewer
  int mx_tile_m = 0;  // or, with mx_chunk 0, the packed GEMM's token tile (64 or 128)
  Activation activation = Activation::Silu;
  float limit = 0.0f, alpha = 1.702f, beta = 1.0f;  // MoeSpec's swiglu_limit / _alpha / _beta
  // the unfused shared MLP's output [T, H] fp32 and its per-token scale [T]: both or neither
  const float* shared_partial = nullptr;
  const float* shared_scale = nullptr;
  __nv_bfloat16* y = nullptr;  // [T, H]
  int* error_flag = nullptr;   // set to 1 when an id falls outside [0, rows) (its slot dropped);
                               // or null

  PrefillGemm gemm = PrefillGemm::Cutlass;
  // the CUTLASS instances of the gate/up and the down GEMM: rows of plan::grouped_gemm_kernels()
  // of the weights' dtype (fp8 rows for fp8 weights, bf16 rows for bf16 and MX ones);
  // plan::LayerPlan::grouped_gate_up / grouped_down
  int gate_up_gemm = -1;
  int down_gemm = -1;

  // prefill_workspace_bytes(max_tokens, slots, rows, hidden, inter, fp8, mx_chunk)
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Device workspace of the path for up to max_tokens tokens (permuted x, gate/up, h, the down
// partials, the plan and both GEMMs' group arrays and CUTLASS workspaces), on the current device;
// fp8: for fp8 block-scale weights (x and h as e4m3 with their scales, the fp8 GEMM's arrays);
// mx_chunk > 0: for MX experts widened mx_chunk at a time (their bf16 matrices).
size_t prefill_workspace_bytes(int max_tokens, int slots, int rows, int hidden, int inter,
                               bool fp8 = false, int mx_chunk = 0);

// Whether the current device runs the path (sm_90a: compute capability 9.0); else `why`.
bool prefill_supported(const char** why = nullptr);

// Runs the path in `stream` (7 launches; MX widened: 2 more per run of mx_chunk experts). Throws
// moekit::Error naming the bad field before any launch (shapes, alignment, the workspace's size).
void launch_prefill_experts(const PrefillParams& p, cudaStream_t stream);

// The expert GEMMs' FLOPs of one forward: 2 * pairs * (H * 2I + I * H) (for expert_tflops).
double prefill_expert_flops(int tokens, int slots, int hidden, int inter);

}  // namespace moekit::cuda
