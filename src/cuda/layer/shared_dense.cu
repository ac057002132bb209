// SharedDenseMlp (shared_dense.h). Row-major out[M, N] = A[M, K] B[N, K]^T is, column-major,
// out^T[N, M] = B^T A^T: cublasGemmEx(op T on B as a column-major [K, N] matrix, op N on A as
// column-major [K, M]), bf16 inputs, fp32 output and compute (CUBLAS_COMPUTE_32F: no tf32).
#include <algorithm>

#include "cuda/common/cublas_check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/experts/experts_common.cuh"
#include "cuda/layer/shared_dense.h"

namespace moekit::cuda {
namespace {

using experts_detail::activate;

constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLAS' recommendation for Hopper

// h[t, i] = bf16(act(gate_up[t, i], gate_up[t, inter + i])), four columns a thread.
__global__ void activate_kernel(const float* gate_up, __nv_bfloat16* h, int tokens, int inter,
                                SharedActivation a) {
  const int quads = inter / 4;
  const long long total = static_cast<long long>(tokens) * quads;
  for (long long q = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; q < total;
       q += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long t = q / quads;
    const int i = static_cast<int>(q % quads) * 4;
    const float* row = gate_up + t * 2 * inter;
    const float4 g = *reinterpret_cast<const float4*>(row + i);
    const float4 u = *reinterpret_cast<const float4*>(row + inter + i);
    __nv_bfloat162 lo, hi;
    lo.x = __float2bfloat16_rn(activate(a.activation, g.x, u.x, a.limit, a.alpha, a.beta));
    lo.y = __float2bfloat16_rn(activate(a.activation, g.y, u.y, a.limit, a.alpha, a.beta));
    hi.x = __float2bfloat16_rn(activate(a.activation, g.z, u.z, a.limit, a.alpha, a.beta));
    hi.y = __float2bfloat16_rn(activate(a.activation, g.w, u.w, a.limit, a.alpha, a.beta));
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(h + t * inter + i);
    out[0] = lo;
    out[1] = hi;
  }
}

// out[m, n] (row-major, fp32) = a[m, k] b[n, k]^T, a and b bf16 row-major.
void gemm_nt(cublasHandle_t handle, const __nv_bfloat16* a, const __nv_bfloat16* b, float* out,
             int m, int n, int k) {
  const float alpha = 1.0f;
  const float beta = 0.0f;
  MK_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_16BF, k,
                               a, CUDA_R_16BF, k, &beta, out, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
}

}  // namespace

SharedDenseMlp::SharedDenseMlp(int max_tokens, int hidden, int inter)
    : max_tokens_(max_tokens), hidden_(hidden), inter_(inter) {
  MK_CHECK(max_tokens >= 1 && hidden >= 1 && inter >= 4 && inter % 4 == 0,
           "dense shared MLP: expected max_tokens, hidden >= 1 and inter a multiple of 4, got "
               << max_tokens << ", " << hidden << ", " << inter);
  try {
    MK_CUBLAS_CHECK(cublasCreate(&handle_));
    MK_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    MK_CUDA_CHECK(
        cudaMalloc(&gate_up_, static_cast<size_t>(max_tokens) * 2 * inter * sizeof(float)));
  } catch (...) {
    release();  // (no destructor runs for a constructor that throws)
    throw;
  }
}

SharedDenseMlp::~SharedDenseMlp() { release(); }

void SharedDenseMlp::release() {
  if (gate_up_ != nullptr) MK_CUDA_WARN(cudaFree(gate_up_));
  if (workspace_ != nullptr) MK_CUDA_WARN(cudaFree(workspace_));
  if (handle_ != nullptr) (void)cublasDestroy(handle_);
  gate_up_ = nullptr;
  workspace_ = nullptr;
  handle_ = nullptr;
}

void SharedDenseMlp::forward(const __nv_bfloat16* x, const __nv_bfloat16* w13,
                             const __nv_bfloat16* w2, int tokens, const SharedActivation& act,
                             __nv_bfloat16* h, float* out, cudaStream_t stream) {
  MK_CHECK(tokens >= 1 && tokens <= max_tokens_,
           "dense shared MLP: expected 1 <= tokens <= " << max_tokens_ << ", got " << tokens);
  MK_CUBLAS_CHECK(cublasSetStream(handle_, stream));
  // (cublasSetStream resets the handle to cuBLAS' default workspace pool, which may allocate:
  // not inside a graph capture)
  MK_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes));
  gemm_nt(handle_, x, w13, gate_up_, tokens, 2 * inter_, hidden_);
  constexpr int kBlock = 256;
  const long long quads = static_cast<long long>(tokens) * (inter_ / 4);
  const unsigned grid =
      static_cast<unsigned>(std::min<long long>((quads + kBlock - 1) / kBlock, 4096));
  activate_kernel<<<grid, kBlock, 0, stream>>>(gate_up_, h, tokens, inter_, act);
  MK_CUDA_CHECK_LAUNCH();
  gemm_nt(handle_, h, w2, out, tokens, hidden_, inter_);
}

}  // namespace moekit::cuda
