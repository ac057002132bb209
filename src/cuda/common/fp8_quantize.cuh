// The activation quantiser of the fp8 (W8A8) paths on the GPU, the rule of
// cpu_reference::quantize_activation_fp8 (reference_fp8.cpp) bit for bit:
//
//   s = max(amax, 1e-4) / 448 in fp32 (ue8m0: s = 2^ceil(log2 s), exact on the bits),
//   q = e4m3(v / s), v / s with the codes of a true (IEEE round-to-nearest) division
//       (fp8_quotient), the conversion cvt.rn.satfinite.e4m3x2.f32 (round to nearest even,
//       |v / s| > 448 saturates to 448).
//
// A 128-value group is held by a half-warp, 8 values a lane; the group's amax is a 4-step xor
// shuffle inside the half-warp.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/fp8_quotient.h"

namespace moekit::cuda {

constexpr int kFp8GroupLanes = 16;  // lanes per 128-value group: a half-warp, 8 values each

// The 8 values of this lane in a group held by its half-warp -> 8 e4m3 codes (in value order,
// packed little-endian) and the group's scale (returned, on every lane of the half-warp).
__device__ __forceinline__ float quantize_group_fp8(const float (&v)[8], bool ue8m0, uint2* q) {
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(v[k]));
  const unsigned half = 0xffffu << (threadIdx.x & 16);
#pragma unroll
  for (int off = 8; off >= 1; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(half, amax, off));
  // why: the floor gives an all-zero group a finite scale and zero codes (DeepSeek's act_quant)
  float s = __fdiv_rn(fmaxf(amax, 1e-4f), 448.0f);
  if (ue8m0) {
    // s > 0 and normal: a power of two stays, else the next one up (exponent + 1, mantissa 0)
    uint32_t bits = __float_as_uint(s);
    if ((bits & 0x7fffffu) != 0) bits = (bits & 0xff800000u) + 0x00800000u;
    s = __uint_as_float(bits);
  }
  const float r = __frcp_rn(s);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair =
        make_float2(fp8_quotient(v[2 * i], s, r), fp8_quotient(v[2 * i + 1], s, r));
    // (the first value in the low byte)
    w[i] = __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
  }
  *q = make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
  return s;
}

}  // namespace moekit::cuda
