// Launcher of router_gemm_naive (router_gemm_naive.cuh), both weight dtypes.
#include "cuda/router_gemm/router_gemm_launch.h"
#include "cuda/router_gemm/router_gemm_naive.cuh"

namespace moekit::cuda::router_gemm_detail {

void launch_router_gemm_naive(const RouterGemmProblem& p, cudaStream_t stream) {
  constexpr int kBlock = 256;
  const long long total = static_cast<long long>(p.m) * p.n;
  const dim3 grid(static_cast<unsigned>((total + kBlock - 1) / kBlock));
  if (p.weight_dtype == DType::F32) {
    launch_kernel(router_gemm_naive_kernel<float>, grid, dim3(kBlock), 1, stream, make_args(p));
  } else {
    launch_kernel(router_gemm_naive_kernel<__nv_bfloat16>, grid, dim3(kBlock), 1, stream,
                  make_args(p));
  }
}

}  // namespace moekit::cuda::router_gemm_detail
