// The prefill path's fp8 grouped GEMM with 128-block scaling (W8A8), for fp8 block-scale experts:
// for every group g,
//
//   D_g[m, n] = sum over K blocks b of (sum_{k in b} A_g[m, k] B_g[n, k]) * SA_g[m, b] *
//   SB_g[n/128, b]
//
// A [M_g, K] and B [N_g, K] e4m3 (row-major, K contiguous), SA [M_g, K/128] fp32 (one scale per
// row per 128 K: the activation quantiser's, row-major), SB [N_g/128, K/128] fp32 (one per
// 128 x 128 weight tile, row-major: the checkpoint's weight_scale_inv grid as stored), fp32
// accumulation, D [M_g, N_g] bf16 (rounded once). N_g and K are multiples of 128.
//
// As the bf16 GEMM (prefill_gemm.h), every per-group array lives on the device, written by the
// plan kernel each forward, so a launch needs no host synchronisation; groups with M_g = 0 take no
// tile. The CUTLASS instances are the fp8 rows of plan::grouped_gemm_kernels() (sm_90a); their
// naive twin is prefill_gemm_fp8_naive.cu. This header holds no CUTLASS type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/prefill/prefill_gemm.h"

namespace moekit::cuda {

// Per-group arrays of one fp8 grouped GEMM, each [groups], on the device.
struct PrefillFp8GroupArrays {
  PrefillProblem* problems = nullptr;  // {M_g, N_g, K}
  const uint8_t** a = nullptr;         // e4m3 [M_g, K]
  const uint8_t** b = nullptr;         // e4m3 [N_g, K]
  const float** scale_a = nullptr;     // [M_g, K/128]
  const float** scale_b = nullptr;     // [N_g/128, K/128]
  __nv_bfloat16** d = nullptr;         // [M_g, N_g]
  int64_t* stride_a = nullptr;         // leading dimension of A (its K)
  int64_t* stride_b = nullptr;         // leading dimension of B (its K)
  int64_t* stride_d = nullptr;         // leading dimension of D (its N)
};

// The scale block along K (and along N of B): the checkpoints' weight_block_size.
constexpr int kPrefillFp8Block = 128;
// Launches fp8 instance `kernel` (a row of plan::grouped_gemm_kernels(), prefill_gemm.h) over
// `groups` groups whose arrays the stream's earlier kernels wrote; `workspace` holds
// prefill_gemm_workspace_bytes(groups) bytes. Throws moekit::Error naming the row or CUTLASS's
// status when the kernel cannot run (e.g. no sm_90a device).
void run_prefill_gemm_fp8(const PrefillFp8GroupArrays& arrays, int groups, int kernel,
                          void* workspace, cudaStream_t stream);

// The naive twin: the same arrays, N of every group <= max_n; the formula above with the block
// sums in fp32 in K order.
void run_prefill_gemm_fp8_naive(const PrefillFp8GroupArrays& arrays, int groups, int max_n,
                                cudaStream_t stream);

}  // namespace moekit::cuda
