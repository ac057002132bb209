// The router GEMM op on the GPU: logits[M,N] = x[M,K] . Wg[N,K]^T (+ bias[N]), fp32 out.
//
// Three layers (STYLE.md): kernels in router_gemm_*.cuh, launchers in router_gemm_launch.h /
// router_gemm_{naive,dot_*,splitk_bf16,cublas}.cu, and this op (router_gemm.cu), which validates,
// looks the config up (include/moekit/tuning.h) and switches on the backend. The layer calls
// router_gemm(problem, stream); warm_up_router_gemm(spec, ...) before capturing a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include "moekit/dtype.h"
#include "moekit/tuning.h"

namespace moekit {
struct MoeSpec;
}

namespace moekit::cuda {

struct RouterGemmProblem {
  int m = 0;                          // tokens (0 = nothing to do)
  int n = 0;                          // output columns (experts, + 1 for a gated shared expert)
  int k = 0;                          // hidden size
  DType weight_dtype = DType::BF16;   // BF16 or F32
  const void* x = nullptr;            // bf16 [m, k] row-major, device
  const void* weight = nullptr;       // weight_dtype [n, k] row-major, device
  const float* bias = nullptr;        // fp32 [n] or nullptr (gpt-oss router bias)
  float* out = nullptr;               // fp32 [m, n] row-major, device
  unsigned long long* trace = nullptr;  // kernel timeline words (cuda/common/trace.cuh) or null
};

// Validates (throws "expected X, got Y"), returns at once when m == 0, picks the config through
// the tuning tables for this device's architecture and launches on `stream`. No host sync, no
// allocation once warm_up_router_gemm covered the shape (so it can be captured in a CUDA graph).
// Kernels launch with programmatic dependent launch: they read the weights before waiting on the
// previous kernel, so weights must not be written by the kernel just before (they never are).
void router_gemm(const RouterGemmProblem& p, cudaStream_t stream);

// The same with an explicit config (tests, the tuner); throws naming the config and the shape
// when the config cannot run it.
void router_gemm(const RouterGemmProblem& p, const tuning::RouterGemmConfig& config,
                 cudaStream_t stream);

// What router_gemm(p, stream) runs for this problem on the current device.
tuning::RouterGemmChoice router_gemm_choice(const RouterGemmProblem& p);

// The architecture family of the current device (cached per device).
tuning::Arch current_arch();

// Prepares every router shape of `spec` (K = hidden, N = router_columns, router dtype, bias) for
// M = 1..max_m: looks each config up (printing it under MOEKIT_PRINT_CONFIG=1), creates the cuBLAS
// handle and workspaces the chosen configs need, and runs each chosen kernel once so that module
// loading happens now and not inside a graph capture. Synchronises `stream`.
void warm_up_router_gemm(const MoeSpec& spec, int max_m, cudaStream_t stream);

}  // namespace moekit::cuda
