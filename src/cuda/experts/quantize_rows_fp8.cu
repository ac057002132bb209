// quantize_rows_fp8 (quantize_rows_fp8.h): a half-warp per 128-value group (fp8_quantize.cuh),
// in a grid-stride loop whose stride is a multiple of 16 threads, so a group's lanes stay
// together to the end.
#include "cuda/experts/quantize_rows_fp8.h"

#include <algorithm>

#include "cuda/common/cuda_check.h"
#include "cuda/common/fp8_quantize.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/prefill/prefill_vec.cuh"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kGroup = 128;

__global__ void __launch_bounds__(kThreads) quantize_rows_fp8_kernel(
    const __nv_bfloat16* src, long long rows, int k, bool ue8m0, uint8_t* q, float* scales) {
  pdl_launch_dependents();  // (the next kernel's CTAs wait for our completion)
  pdl_wait();               // src: the previous kernel's output
  const int groups = k / kGroup;
  const long long n = rows * groups * kFp8GroupLanes;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long item = i / kFp8GroupLanes;
    const int part = static_cast<int>(i % kFp8GroupLanes);
    const long long r = item / groups;
    const int b = static_cast<int>(item - r * groups);
    const long long at = r * k + b * kGroup + part * 8;
    float v[8];
    prefill_detail::load_bf16x8(src + at, v);
    uint2 codes;
    const float s = quantize_group_fp8(v, ue8m0, &codes);
    *reinterpret_cast<uint2*>(q + at) = codes;
    if (part == 0) scales[r * groups + b] = s;
  }
}

}  // namespace

void quantize_rows_fp8(const __nv_bfloat16* src, int rows, int k, bool ue8m0, uint8_t* q,
                       float* scales, bool pdl, cudaStream_t stream) {
  MK_CHECK(rows >= 1 && k >= kGroup && k % kGroup == 0,
           "quantize_rows_fp8: expected rows >= 1 and k a multiple of 128, got rows "
               << rows << ", k " << k);
  const long long n = static_cast<long long>(rows) * (k / kGroup) * kFp8GroupLanes;
  const int grid = static_cast<int>(std::min<long long>((n + kThreads - 1) / kThreads, 4096));
  launch_pdl(pdl, quantize_rows_fp8_kernel, dim3(grid), dim3(kThreads), 0, stream, src,
             static_cast<long long>(rows), k, ue8m0, q, scales);
}

}  // namespace moekit::cuda
