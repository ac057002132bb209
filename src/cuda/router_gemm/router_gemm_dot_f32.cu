// Instantiations and launcher of router_gemm_dot (router_gemm_dot.cuh) for f32 weights: one
// kernel per entry of MK_ROUTER_GEMM_DOT_VARIANTS (src/tuning/router_gemm_variants.h).
#include "cuda/router_gemm/router_gemm_dot.cuh"
#include "cuda/router_gemm/router_gemm_launch.h"
#include "tuning/router_gemm_variants.h"

namespace moekit::cuda::router_gemm_detail {

void launch_router_gemm_dot_f32(const RouterGemmProblem& p, const tuning::RouterGemmConfig& c,
                                 cudaStream_t stream) {
  // split_k CTAs per output tile, one cluster along x (router_gemm_dot.cuh)
  const dim3 grid((p.n + c.tile_n - 1) / c.tile_n * c.split_k, (p.m + c.tile_m - 1) / c.tile_m);
  const dim3 block(c.block);
  RouterGemmArgs args = make_args(p);
  args.split = c.split_k;
#define MK_ROUTER_GEMM_DOT_CASE_(TN, TM)                                               \
  if (c.tile_n == (TN) && c.tile_m == (TM)) {                                          \
    launch_kernel(router_gemm_dot_kernel<float, TN, TM>, grid, block, c.split_k, stream, \
                  args);                                                               \
    return;                                                                            \
  }
  MK_ROUTER_GEMM_DOT_VARIANTS(MK_ROUTER_GEMM_DOT_CASE_)
#undef MK_ROUTER_GEMM_DOT_CASE_
  MK_FAIL("router_gemm dot: no kernel for tile_n=" << c.tile_n << " tile_m=" << c.tile_m);
}

}  // namespace moekit::cuda::router_gemm_detail
