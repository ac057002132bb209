// The prefill path's MX step (prefill.h): the packed matrices of a run of MX experts, held in the
// MX kernels' layout (cuda/experts/experts_mx_layout.h), widened to their exact bf16 weights
// (w = bf16_rne(element x 2^(s - 127)), the CPU reference's rule and the bulk MX kernels',
// experts_mx.cuh) in the bf16 GEMM's row-major [experts, rows, k], natural row order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/prefill/prefill_gemm.h"
#include "moekit/expert_format.h"

namespace moekit::cuda {

// One matrix of every expert: w13 ([2I, H], gate rows then up rows) or w2 ([H, I]).
struct MxMatrices {
  ExpertFormat format = ExpertFormat::Mxfp4;  // Mxfp4 or Mxfp8
  bool gate_up = false;                       // w13 (its tiles pair gate and up rows)
  int rows = 0, k = 0;                        // the matrix's shape: rows % 16 == 0, k % 32 == 0
  const uint8_t* packed = nullptr;  // [experts][rows * mx_row_bytes(k)], the kernels' layout
  const uint8_t* scales = nullptr;  // [experts][mx_scale_layout_bytes(rows, k)]
};

// dst[e - first] = the bf16 matrix of expert e, for e in [first, first + count), in `stream`.
// Experts whose group of `problems` (the GEMM's, indexed by e; null: none) has no rows are
// skipped: the GEMM takes no tile of them.
void launch_mx_widen(const MxMatrices& m, int first, int count, const PrefillProblem* problems,
                     __nv_bfloat16* dst, cudaStream_t stream);

}  // namespace moekit::cuda
