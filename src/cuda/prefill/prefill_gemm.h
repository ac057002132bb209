// The prefill path's grouped GEMM (prefill_gemm_instance.cuh, CUTLASS 3.x ptr-array grouped GEMMs
// for sm_90a): for every group g, D_g[M_g, N_g] = A_g[M_g, K_g] . B_g[N_g, K_g]^T, bf16 in, fp32
// accumulate, bf16 out (rounded once, as a bf16 Linear's output), all row-major (A and B
// K-contiguous, D N-contiguous).
//
// The problem sizes, pointers and strides live on the DEVICE (PrefillGroupArrays), written by a
// kernel of ours each forward (prefill_kernels.cu) from the dispatch's counts, so a launch needs no
// host synchronisation and a CUDA graph can capture it; the host passes the group count only.
// Groups with M_g = 0 take no tile. This header holds no CUTLASS type: the arrays' element
// layouts (3 ints per problem, one int64 per stride) are checked against CUTLASS's in the .cuh.
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
  __nv_bfloat16** d = nullptr;
  int64_t* stride_a = nullptr;  // leading dimension of A (its K): CUTLASS's Stride<int64, _1, _0>
  int64_t* stride_b = nullptr;  // leading dimension of B (its K)
  int64_t* stride_d = nullptr;  // leading dimension of D (its N)
};

// The CUTLASS instances are the rows of plan::grouped_gemm_kernels() (src/plan/
// grouped_gemm_kernels.h), each instantiated by its own instances/<name>.cu
// (prefill_gemm_instance.cuh); `kernel` below is a row index. The plan picks the rows
// (plan::LayerPlan::grouped_gate_up / grouped_down).

// Device bytes of the CUTLASS workspace (per-SM TMA descriptors) a grouped GEMM of `groups`
// groups needs on the current device, for any instance.
size_t prefill_gemm_workspace_bytes(int groups);

// Launches bf16 instance `kernel` over `groups` groups whose arrays the stream's earlier kernels
// wrote; `workspace` holds prefill_gemm_workspace_bytes(groups) bytes. Throws moekit::Error
// naming the row or CUTLASS's status when the kernel cannot run (e.g. no sm_90a device).
void run_prefill_gemm(const PrefillGroupArrays& arrays, int groups, int kernel, void* workspace,
                      cudaStream_t stream);

// The naive twin (prefill_gemm_naive.cu): the same arrays, N of every group <= max_n.
void run_prefill_gemm_naive(const PrefillGroupArrays& arrays, int groups, int max_n,
                            cudaStream_t stream);

// Whether the current device runs the sm_90a kernel (compute capability 9.0); else why not.
bool prefill_gemm_supported(const char** why);

// The current device's SM count, asked once per process (the instances' persistent grids).
int prefill_sm_count();

// Each row's entries, instantiated by its translation unit (MOEKIT_PREFILL_GEMM_INSTANCE);
// `arrays` points to a PrefillGroupArrays (bf16 rows) or a PrefillFp8GroupArrays (fp8 rows).
template <int kRow>
size_t grouped_gemm_workspace_bytes_row(int groups);
template <int kRow>
void run_grouped_gemm_row(const void* arrays, int groups, void* workspace, cudaStream_t stream);

// Row `kernel`'s launch, its dtype checked against `fp8` (prefill_gemm.cu).
void run_grouped_gemm(int kernel, bool fp8, const void* arrays, int groups, void* workspace,
                      cudaStream_t stream);

}  // namespace moekit::cuda
