// fp8_quotient (src/common/fp8_quotient.h), the GPU quantiser's division: over the operands the
// activation quantiser meets (s = max(amax, 1e-4) / 448, or its power of two under ue8m0, and
// |v| <= amax, v a bf16 value), its e4m3 code is the IEEE quotient's, so the GPU's W8A8 kernels
// quantise exactly as cpu_reference::quantize_activation_fp8. Random groups, every bf16 value
// against a few scales (the all-ones mantissa, where a one-step reciprocal is least exact), and
// the float quotients themselves, which differ (if at all) only below e4m3's resolution.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/fp8_quotient.h"
#include "moekit/dtype.h"

namespace moekit {
namespace {

float scale_of(float amax, bool ue8m0) {
  float s = std::max(amax, 1e-4f) / 448.0f;
  if (ue8m0) {
    int e = 0;
    const float m = std::frexp(s, &e);
    s = std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
  }
  return s;
}

float bf16_bits_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The codes of v / s by the division and by fp8_quotient agree; returns whether the float
// quotients agree too.
bool check(float v, float s) {
  const float exact = v / s;
  const float fast = fp8_quotient(v, s, 1.0f / s);
  EXPECT_EQ(float_to_fp8_e4m3(fast), float_to_fp8_e4m3(exact)) << "v " << v << " s " << s;
  return std::memcmp(&exact, &fast, 4) == 0 || std::fabs(exact) < 0x1p-10f;
}

TEST(Fp8Quotient, RandomGroupsGiveTheDivisionsCodes) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-30.0f, 30.0f), unit(-1.0f, 1.0f);
  int float_differences = 0;
  for (int group = 0; group < 20000; ++group) {
    const float amax = std::abs(bf16_to_float(float_to_bf16(std::exp2(exponent(rng)))));
    for (const bool ue8m0 : {false, true}) {
      const float s = scale_of(amax, ue8m0);
      for (int i = 0; i < 64; ++i) {
        const float v = bf16_to_float(float_to_bf16(amax * unit(rng)));
        float_differences += check(v, s) ? 0 : 1;
      }
      float_differences += check(amax, s) ? 0 : 1;
      float_differences += check(-amax, s) ? 0 : 1;
    }
  }
  EXPECT_EQ(float_differences, 0) << "quotients above 2^-10 that differ from the division's";
}

TEST(Fp8Quotient, EveryBf16ValueAgainstHardScales) {
  // amax 1 (s = 1/448), a scale whose mantissa is all ones, the amax floor, a large amax
  const float scales[] = {scale_of(1.0f, false), std::nextafter(0.5f, 0.0f), scale_of(0.0f, false),
                          scale_of(3.0e30f, false), scale_of(0.3f, true)};
  int float_differences = 0;
  for (const float s : scales) {
    for (uint32_t b = 0; b < 0x10000; ++b) {
      const float v = bf16_bits_value(static_cast<uint16_t>(b));
      if (!std::isfinite(v) || std::fabs(v) > 448.0f * s) continue;  // (|v| <= amax <= 448 s)
      float_differences += check(v, s) ? 0 : 1;
    }
  }
  EXPECT_EQ(float_differences, 0) << "quotients above 2^-10 that differ from the division's";
}

}  // namespace
}  // namespace moekit
