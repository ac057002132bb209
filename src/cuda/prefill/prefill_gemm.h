// The prefill path's grouped GEMM (prefill_gemm.cu, CUTLASS 3.x ptr-array grouped GEMM for sm_90a):
// for every group g, D_g[M_g, N_g] = A_g[M_g, K_g] . B_g[N_g, K_g]^T, bf16 in, fp32 accumulate,
// fp32 out, all row-major (A and B K-contiguous, D N-contiguous).
//
// The problem sizes, pointers and strides live on the DEVICE (PrefillGroupArrays), written by a
// kernel of ours each forward (prefill_kernels.cu) from the dispatch's counts, so a launch needs no
// host synchronisation and a CUDA graph can capture it; the host passes the group count only.
// Groups with M_g = 0 take no tile. This header holds no CUTLASS type: the arrays' element
// layouts (3 ints per problem, one int64 per stride) are checked against CUTLASS's in the .cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace moekit::cuda {

// One group's {M, N, K} as CUTLASS's GroupProblemShape<Shape<int,int,int>> stores it.
struct PrefillProblem {
  int m, n, k;
};

// Per-group arrays of one grouped GEMM, each [groups], on the device.
struct PrefillGroupArrays {
  PrefillProblem* problems = nullptr;
  const __nv_bfloat16** a = nullptr;
  const __nv_bfloat16** b = nullptr;
  float** d = nullptr;
  int64_t* stride_a = nullptr;  // leading dimension of A (its K): CUTLASS's Stride<int64, _1, _0>
  int64_t* stride_b = nullptr;  // leading dimension of B (its K)
  int64_t* stride_d = nullptr;  // leading dimension of D (its N)
};

// Tile of the one kernel instance (M x N x K): 128 x 256 x 64, cluster 1 x 1, cooperative (two
// consumer warpgroups of 64 rows each). M is the tokens of one expert: an expert of 129 tokens
// takes a second, nearly empty m-tile (DeepSeek-V3 at 4096 tokens averages 128 per expert), so a
// 64-row tile or the operands swapped (tokens on N) are the next instance to measure.
constexpr int kPrefillTileM = 128;
constexpr int kPrefillTileN = 256;

// Device bytes of the CUTLASS workspace (per-SM TMA descriptors) a grouped GEMM of `groups`
// groups needs on the current device.
size_t prefill_gemm_workspace_bytes(int groups);

// Launches the grouped GEMM over `groups` groups whose arrays the stream's earlier kernels
// wrote; `workspace` holds prefill_gemm_workspace_bytes(groups) bytes. Throws moekit::Error
// naming CUTLASS's status when the kernel cannot run (e.g. no sm_90a device).
void run_prefill_gemm(const PrefillGroupArrays& arrays, int groups, void* workspace,
                      cudaStream_t stream);

// The naive twin (prefill_gemm_naive.cu): the same arrays, N of every group <= max_n.
void run_prefill_gemm_naive(const PrefillGroupArrays& arrays, int groups, int max_n,
                            cudaStream_t stream);

// Whether the current device runs the sm_90a kernel (compute capability 9.0); else why not.
bool prefill_gemm_supported(const char** why);

}  // namespace moekit::cuda
