// The prefill path's MX steps (prefill.h), on the packed matrices of MX experts held in the MX
// kernels' layout (cuda/experts/experts_mx_layout.h), each weight its exact bf16
// (w = bf16_rne(element x 2^(s - 127)), the CPU reference's rule and the bulk MX kernels',
// experts_mx.cuh): a run of experts widened to the bf16 GEMM's row-major [experts, rows, k],
// natural row order, or the grouped GEMM that reads the packed bytes itself.
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

// For every group g < groups (expert g's matrix of m): D_g[M_g, rows] = A_g[M_g, k] . W_g^T, D in
// the matrix's natural row order (gate rows, then up rows), bf16 in, fp32 accumulate, bf16 out
// (rounded once, as the bf16 GEMMs' D), A and D as `arrays` give them (their b is not read); tiles
// of tile_m (64 or 128) tokens. rows % 16 == 0; groups <= 1024.
void run_prefill_gemm_mx(const MxMatrices& m, const PrefillGroupArrays& arrays, int groups,
                         int tile_m, cudaStream_t stream);

}  // namespace moekit::cuda
