// Vector loads and stores of the prefill path's elementwise kernels (prefill_kernels.cu,
// prefill_kernels_fp8.cu): 8 bf16 or 8 fp32 at a time, 16-byte aligned, and the grid of their
// grid-stride launches.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace moekit::cuda::prefill_detail {

// 8 consecutive bf16 (16 bytes, 16-byte aligned) as floats, and back
__device__ __forceinline__ void load_bf16x8(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 bits = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void store_bf16x8(__nv_bfloat16* p, const float (&v)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}
// 8 consecutive floats (32 bytes, 16-byte aligned) added into v, times `scale`
__device__ __forceinline__ void add_f32x8(const float* p, float scale, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] += scale * a.x;
  v[1] += scale * a.y;
  v[2] += scale * a.z;
  v[3] += scale * a.w;
  v[4] += scale * b.x;
  v[5] += scale * b.y;
  v[6] += scale * b.z;
  v[7] += scale * b.w;
}

// A grid-stride launch's grid for n threads' work: one thread per item up to a cap of 16 CTAs per
// SM of an H200 (132 SMs), past which the threads loop.
constexpr long long kStrideGridCap = 132LL * 16;
inline int stride_grid(long long n, int threads) {
  const long long need = (n + threads - 1) / threads;
  return static_cast<int>(std::max<long long>(1, std::min<long long>(need, kStrideGridCap)));
}

}  // namespace moekit::cuda::prefill_detail
