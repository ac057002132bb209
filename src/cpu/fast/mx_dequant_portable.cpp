// MX row dequantisation without intrinsics (kernels.h, dequant_mxfp4_row / dequant_mxfp8_row):
// a table of the element values, the e8m0 scale from a table, and bf16's round to nearest even.
#include <array>
#include <cmath>

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {

namespace {

// e2m1 by code: 0, 0.5, 1, 1.5, 2, 3, 4, 6, then the same negated (code 8 is -0).
constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

const float* mx_scale_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int s = 0; s < 256; ++s) t[s] = s == 255 ? NAN : std::ldexp(1.0f, s - 127);
    return t;
  }();
  return table.data();
}

const E2m1Row* mx_e2m1_f32_table() {
  static const std::array<E2m1Row, 255> table = [] {
    std::array<E2m1Row, 255> t{};
    for (int s = 0; s < 255; ++s)
      for (int c = 0; c < 16; ++c) t[s].f32[c] = kE2m1[c] * std::ldexp(1.0f, s - 127);
    return t;
  }();
  return table.data();
}

const E2m1RowBf16* mx_e2m1_bf16_table() {
  static const std::array<E2m1RowBf16, 255> table = [] {
    std::array<E2m1RowBf16, 255> t{};
    const E2m1Row* f = mx_e2m1_f32_table();
    for (int s = 0; s < 255; ++s)
      for (int c = 0; c < 16; ++c) t[s].bits[c] = float_to_bf16(f[s].f32[c]).bits;
    return t;
  }();
  return table.data();
}

void dequant_mxfp4_row_portable(const uint8_t* q, const uint8_t* scale, int k, Bf16* out) {
  const float* st = mx_scale_table();
  for (int c = 0; c < k; c += 2) {
    const float s = st[scale[c >> 5]];
    out[c] = float_to_bf16(kE2m1[q[c >> 1] & 15] * s);
    out[c + 1] = float_to_bf16(kE2m1[q[c >> 1] >> 4] * s);
  }
}

void dequant_mxfp8_row_portable(const uint8_t* q, const uint8_t* scale, int k, Bf16* out) {
  static const std::array<float, 256> e4m3 = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_float(static_cast<uint8_t>(i));
    return t;
  }();
  const float* st = mx_scale_table();
  for (int c = 0; c < k; ++c) out[c] = float_to_bf16(e4m3[q[c]] * st[scale[c >> 5]]);
}

}  // namespace moekit::cpu_fast::detail
