// The naive twin of the prefill fp8 grouped GEMM (prefill_gemm_fp8.h): the same device arrays,
// one thread per output element, the W8A8 formula written out: per 128-wide K block the e4m3
// products (each exact in fp32) summed in fp32 in K order, the block sum times SA x SB added into
// an fp32 accumulator, D rounded to bf16. The second reference of the fp8 path
// (PrefillGemm::Naive) and the way in for reading the CUTLASS instance. Not for speed.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "cuda/common/cuda_check.h"
#include "cuda/prefill/prefill_gemm_fp8.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

constexpr int kNaiveThreads = 128;  // output columns per CTA
constexpr int kNaiveRowSteps = 16;  // CTAs along M per group; each strides over the group's rows

__device__ __forceinline__ float e4m3_value(uint8_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(code, __NV_E4M3);
  return __half2float(__half(h));
}

// grid (ceil(max_n / 128), kNaiveRowSteps, groups): thread -> column n of rows m = y, y + 16, ...
__global__ void prefill_gemm_fp8_naive_kernel(PrefillFp8GroupArrays g) {
  const int group = blockIdx.z;
  const PrefillProblem pr = g.problems[group];
  const int n = blockIdx.x * kNaiveThreads + threadIdx.x;
  if (n >= pr.n) return;
  const int blocks = pr.k / kPrefillFp8Block;
  const uint8_t* b = g.b[group] + static_cast<long long>(n) * g.stride_b[group];
  const float* sb = g.scale_b[group] + static_cast<long long>(n / kPrefillFp8Block) * blocks;
  for (int m = blockIdx.y; m < pr.m; m += kNaiveRowSteps) {
    const uint8_t* a = g.a[group] + static_cast<long long>(m) * g.stride_a[group];
    const float* sa = g.scale_a[group] + static_cast<long long>(m) * blocks;
    float acc = 0.0f;
    for (int kb = 0; kb < blocks; ++kb) {
      float block = 0.0f;
      for (int k = kb * kPrefillFp8Block; k < (kb + 1) * kPrefillFp8Block; ++k) {
        block += e4m3_value(a[k]) * e4m3_value(b[k]);
      }
      acc += block * (sa[kb] * sb[kb]);
    }
    g.d[group][static_cast<long long>(m) * g.stride_d[group] + n] = __float2bfloat16_rn(acc);
  }
}

}  // namespace

void run_prefill_gemm_fp8_naive(const PrefillFp8GroupArrays& arrays, int groups, int max_n,
                                cudaStream_t stream) {
  MK_CHECK(groups >= 1 && max_n >= 1,
           "prefill fp8 naive GEMM: expected >= 1 groups and max_n >= 1, got " << groups << ", "
                                                                               << max_n);
  const dim3 grid((max_n + kNaiveThreads - 1) / kNaiveThreads, kNaiveRowSteps, groups);
  prefill_gemm_fp8_naive_kernel<<<grid, kNaiveThreads, 0, stream>>>(arrays);
  MK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moekit::cuda
