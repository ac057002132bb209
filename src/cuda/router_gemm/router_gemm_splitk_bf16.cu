// Instantiations and launcher of router_gemm_splitk (router_gemm_splitk.cuh), bf16 weights: one
// kernel per entry of MK_ROUTER_GEMM_SPLITK_VARIANTS (src/tuning/router_gemm_variants.h).
#include "cuda/router_gemm/router_gemm_launch.h"
#include "cuda/router_gemm/router_gemm_splitk.cuh"
#include "tuning/router_gemm_variants.h"

namespace moekit::cuda::router_gemm_detail {

void launch_router_gemm_splitk_bf16(const RouterGemmProblem& p,
                                    const tuning::RouterGemmConfig& c, cudaStream_t stream) {
  const dim3 grid(c.split_k, (p.n + c.tile_n - 1) / c.tile_n, (p.m + c.tile_m - 1) / c.tile_m);
  const dim3 block(c.block);
#define MK_ROUTER_GEMM_SPLITK_CASE_(TN, TM)                                                 \
  if (c.tile_n == (TN) && c.tile_m == (TM)) {                                               \
    launch_kernel(router_gemm_splitk_kernel<TN, TM>, grid, block, c.split_k, stream,        \
                  make_args(p));                                                            \
    return;                                                                                 \
  }
  MK_ROUTER_GEMM_SPLITK_VARIANTS(MK_ROUTER_GEMM_SPLITK_CASE_)
#undef MK_ROUTER_GEMM_SPLITK_CASE_
  MK_FAIL("router_gemm splitk: no kernel for tile_n=" << c.tile_n << " tile_m=" << c.tile_m);
}

}  // namespace moekit::cuda::router_gemm_detail
