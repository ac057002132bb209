// The quotient v / s of the e4m3 activation quantiser (cpu_reference::quantize_activation_fp8's
// rule, run by the GPU's W8A8 kernels) without the IEEE division's slow path: with r = 1/s
// rounded to nearest, q = v r corrected once by its exact residual v - q s. For the operands the
// quantiser meets (s a normal number, |v| <= 448 s) it gives the e4m3 code of the IEEE quotient
// (tests/test_fp8_quotient.cpp); the division's range checks and slow-path call cost the GPU
// kernels more than the rest of the quantiser.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define MK_FP8_HD __host__ __device__
#else
#define MK_FP8_HD
#endif

namespace moekit {

MK_FP8_HD inline float fp8_quotient(float v, float s, float r) {
  // (the quotient has v's sign, s being positive: -0 stays -0, which the correction would make +0)
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(v, r);
  return copysignf(__fmaf_rn(r, __fmaf_rn(-s, q, v), q), v);
#else
  const float q = v * r;
  return std::copysign(std::fma(r, std::fma(-s, q, v), q), v);
#endif
}

}  // namespace moekit

#undef MK_FP8_HD
