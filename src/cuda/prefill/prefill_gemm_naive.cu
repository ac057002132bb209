// The naive twin of the prefill grouped GEMM (prefill_gemm.h): the same device arrays, one thread
// per output element, an fp32 dot product over K in order, rounded to bf16 as the instances' D. The second reference of the path
// (PrefillGemm::Naive): it checks the plan, permute, activation and combine apart from CUTLASS,
// and is the way in for reading the CUTLASS instance. Not for speed.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/common/cuda_check.h"
#include "cuda/prefill/prefill_gemm.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

constexpr int kNaiveThreads = 128;  // output columns per CTA
constexpr int kNaiveRowSteps = 16;  // CTAs along M per group; each strides over the group's rows

// grid (ceil(max_n / 128), kNaiveRowSteps, groups): thread -> column n of rows m = y, y + 16, ...
__global__ void prefill_gemm_naive_kernel(PrefillGroupArrays g) {
  const int group = blockIdx.z;
  const PrefillProblem pr = g.problems[group];
  const int n = blockIdx.x * kNaiveThreads + threadIdx.x;
  if (n >= pr.n) return;
  const __nv_bfloat16* b = g.b[group] + static_cast<long long>(n) * g.stride_b[group];
  for (int m = blockIdx.y; m < pr.m; m += kNaiveRowSteps) {
    const __nv_bfloat16* a = g.a[group] + static_cast<long long>(m) * g.stride_a[group];
    float acc = 0.0f;
    for (int k = 0; k < pr.k; ++k) acc += __bfloat162float(a[k]) * __bfloat162float(b[k]);
    g.d[group][static_cast<long long>(m) * g.stride_d[group] + n] = __float2bfloat16_rn(acc);
  }
}

}  // namespace

void run_prefill_gemm_naive(const PrefillGroupArrays& arrays, int groups, int max_n,
                            cudaStream_t stream) {
  MK_CHECK(groups >= 1 && max_n >= 1,
           "expected >= 1 groups and max_n >= 1, got " << groups << ", " << max_n);
  const dim3 grid((max_n + kNaiveThreads - 1) / kNaiveThreads, kNaiveRowSteps, groups);
  prefill_gemm_naive_kernel<<<grid, kNaiveThreads, 0, stream>>>(arrays);
  MK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moekit::cuda
