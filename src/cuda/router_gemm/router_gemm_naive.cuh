// router_gemm_naive: the second reference. One thread per output element (token, column), a
// sequential fp32 FMA chain over K.
//
// logits[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]); x bf16 [M,K], w bf16 or fp32 [N,K], fp32 out.
// Grid: ceil(M*N / blockDim) CTAs of blockDim threads; thread i computes element i of out.
// No alignment or shape preconditions: this is the fallback that runs every shape. Slow (each
// thread walks a whole weight row) and kept simple on purpose: the newcomer's way in and a check
// of the fast kernels on the GPU itself.
#pragma once

#include "router_gemm_common.cuh"

namespace moekit::cuda::router_gemm_detail {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// WT: weight element type (__nv_bfloat16 or float).
template <typename WT>
__global__ void router_gemm_naive_kernel(RouterGemmArgs a) {
  griddep_wait();
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long long>(a.m) * a.n) return;
  const int row = static_cast<int>(idx / a.n);
  const int col = static_cast<int>(idx % a.n);
  const __nv_bfloat16* xr = a.x + static_cast<size_t>(row) * a.k;
  const WT* wr = static_cast<const WT*>(a.w) + static_cast<size_t>(col) * a.k;
  float acc = 0.0f;
  for (int i = 0; i < a.k; ++i) acc = fmaf(__bfloat162float(xr[i]), to_float(wr[i]), acc);
  if (a.bias != nullptr) acc += a.bias[col];
  a.out[idx] = acc;
}

}  // namespace moekit::cuda::router_gemm_detail
