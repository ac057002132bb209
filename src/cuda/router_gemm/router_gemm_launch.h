// Router GEMM launchers: runtime config -> template arguments, launch attributes (PDL, cluster),
// launch check. No user-input validation here: router_gemm.cu validates before calling these.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.h"
#include "cuda/router_gemm/router_gemm.h"
#include "cuda/router_gemm/router_gemm_common.cuh"
#include "moekit/tuning.h"

namespace moekit::cuda::router_gemm_detail {

inline RouterGemmArgs make_args(const RouterGemmProblem& p) {
  RouterGemmArgs a{static_cast<const __nv_bfloat16*>(p.x), p.weight, p.bias, p.out,
                   p.m, p.n, p.k};
  a.trace = p.trace;
  return a;
}

// Whether kernels launch with programmatic stream serialisation (PDL): on unless
// set_router_gemm_pdl (moekit/router_gemm.h) switched it off.
bool pdl_enabled();

// Launches kernel<<<grid, block, 0, stream>>>(args) with PDL when enabled and, when
// cluster_x > 1, as clusters of cluster_x CTAs along x.
template <typename Kernel>
void launch_kernel(Kernel kernel, dim3 grid, dim3 block, int cluster_x, cudaStream_t stream,
                   const RouterGemmArgs& args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  int n_attrs = 0;
  if (pdl_enabled()) {
    attrs[n_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n_attrs].val.programmaticStreamSerializationAllowed = 1;
    ++n_attrs;
  }
  if (cluster_x > 1) {
    attrs[n_attrs].id = cudaLaunchAttributeClusterDimension;
    attrs[n_attrs].val.clusterDim.x = static_cast<unsigned>(cluster_x);
    attrs[n_attrs].val.clusterDim.y = 1;
    attrs[n_attrs].val.clusterDim.z = 1;
    ++n_attrs;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = static_cast<unsigned>(n_attrs);
  MK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args));
}

void launch_router_gemm_naive(const RouterGemmProblem& p, cudaStream_t stream);
void launch_router_gemm_dot_bf16(const RouterGemmProblem& p, const tuning::RouterGemmConfig& c,
                                 cudaStream_t stream);
void launch_router_gemm_dot_f32(const RouterGemmProblem& p, const tuning::RouterGemmConfig& c,
                                cudaStream_t stream);
void launch_router_gemm_splitk_bf16(const RouterGemmProblem& p,
                                    const tuning::RouterGemmConfig& c, cudaStream_t stream);
void launch_router_gemm_cublas(const RouterGemmProblem& p, cudaStream_t stream);

// cuBLAS state of the current device (handle, workspace, fp32 staging for x). `max_m_k` sizes
// the staging buffer for fp32 weights; allocation happens here, never inside a capture.
void prepare_router_gemm_cublas(size_t max_m_k_f32);

}  // namespace moekit::cuda::router_gemm_detail
