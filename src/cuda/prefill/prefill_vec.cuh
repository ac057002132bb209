// Vector loads and stores of the prefill path's elementwise kernels (prefill_kernels.cu,
// prefill_kernels_fp8.cu): 8 bf16 or 8 fp32 at a time, 16-byte aligned; the grid of their
// grid-stride launches and their loop over row segments, one warp a segment.
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

// 8 gate and 8 up values of a gate/up row at column j (the up half `inter` further), plus their
// biases' (bias: the row's expert's 2 * inter floats, or null)
__device__ __forceinline__ void load_gate_up_x8(const __nv_bfloat16* row, const float* bias,
                                                int inter, int j, float (&g)[8], float (&u)[8]) {
  load_bf16x8(row + j, g);
  load_bf16x8(row + inter + j, u);
  if (bias != nullptr) {
    add_f32x8(bias + j, 1.0f, g);
    add_f32x8(bias + inter + j, 1.0f, u);
  }
}

// A grid-stride launch's grid for n threads' work: one thread per item up to a cap of 16 CTAs per
// SM of an H200 (132 SMs), past which the threads loop.
constexpr long long kStrideGridCap = 132LL * 16;
inline int stride_grid(long long n, int threads) {
  const long long need = (n + threads - 1) / threads;
  return static_cast<int>(std::max<long long>(1, std::min<long long>(need, kStrideGridCap)));
}

// Segments of `per` columns (or units) a row of n has, the last possibly partial.
__host__ __device__ constexpr int segments(int n, int per) { return (n + per - 1) / per; }

// The grid of a launch over `rows` rows of `segs` segments, one warp a segment
// (for_each_row_segment).
inline int segment_grid(long long rows, int segs, int threads) {
  return stride_grid(rows * segs * 32, threads);
}

// Rows [0, rows) of `segs` segments each, one warp a segment, in a grid-stride loop: f(row, seg,
// lane) runs on all 32 lanes of a warp, which split the segment's columns. why: a thread per 16
// bytes needs a 64-bit division to find its row, which costs more instructions than the copy it
// serves; segments keep wide rows (Mixtral's 14336 columns) spread over as many warps as before.
template <class F>
__device__ __forceinline__ void for_each_row_segment(long long rows, int segs, F&& f) {
  const int warps_per_block = blockDim.x / 32;
  const long long n = rows * segs;
  const long long stride = static_cast<long long>(gridDim.x) * warps_per_block;
  for (long long i = static_cast<long long>(blockIdx.x) * warps_per_block + threadIdx.x / 32; i < n;
       i += stride) {
    const long long r = i / segs;
    f(r, static_cast<int>(i - r * segs), static_cast<int>(threadIdx.x & 31));
  }
}

}  // namespace moekit::cuda::prefill_detail
