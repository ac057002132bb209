// fp8 arithmetic of the CPU reference (reference_fp8.h) and W8A8's activation quantisation
// (layer.h, quantize_activation_fp8).
#include "cpu/reference_fp8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "io/tensor_convert.h"
#include "moekit/error.h"
#include "moekit/layer.h"

namespace moekit {

const char* fp8_compute_name(Fp8Compute m) {
  switch (m) {
    case Fp8Compute::W8A8:
      return "w8a8";
    case Fp8Compute::WeightOnly:
      return "weight-only";
  }
  return "?";
}

Fp8Compute parse_fp8_compute(const std::string& s) {
  if (s == "w8a8") return Fp8Compute::W8A8;
  if (s == "weight-only") return Fp8Compute::WeightOnly;
  MK_FAIL("unknown fp8 compute mode '" << s << "' (expected w8a8 or weight-only)");
}
namespace cpu_reference {

float fp8_value(uint8_t code) {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_float(static_cast<uint8_t>(i));
    return t;
  }();
  return table[code];
}

void dequant_row(const Fp8Rows& w, size_t r, int n, Bf16* out) {
  const uint8_t* q = w.row(r);
  const float* s = w.row_scales(r);
  for (int k = 0; k < n; ++k) out[k] = float_to_bf16(fp8_value(q[k]) * s[k / kFp8Tile]);
}

double dot_w8a8(const Fp8Rows& w, size_t r, const uint8_t* qa, const float* sa, int n) {
  const uint8_t* q = w.row(r);
  const float* ws = w.row_scales(r);
  double acc = 0.0;
  for (int b = 0; b * kFp8Tile < n; ++b) {
    const int k1 = std::min(n, (b + 1) * kFp8Tile);
    double partial = 0.0;
    for (int k = b * kFp8Tile; k < k1; ++k)
      partial += static_cast<double>(fp8_value(qa[k])) * fp8_value(q[k]);
    acc += partial * static_cast<double>(sa[b]) * static_cast<double>(ws[b]);
  }
  return acc;
}

void quantize_activation_fp8(const float* v, int n, bool ue8m0, uint8_t* q, float* scales) {
  constexpr float kE4m3Max = 448.0f;
  // DeepSeek's act_quant floor: an all-zero (or tiny) group gets a finite scale, codes zero.
  constexpr float kAmaxFloor = 1e-4f;
  for (int b = 0; b * kFp8Tile < n; ++b) {
    const int k0 = b * kFp8Tile, k1 = std::min(n, k0 + kFp8Tile);
    float amax = 0.0f;
    for (int k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(v[k]));
    float s = std::max(amax, kAmaxFloor) / kE4m3Max;
    // ue8m0: 2^ceil(log2 s), exact (frexp gives s = m 2^e with m in [0.5, 1)).
    if (ue8m0) {
      int e = 0;
      const float m = std::frexp(s, &e);
      s = std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
    }
    scales[b] = s;
    for (int k = k0; k < k1; ++k) q[k] = io::fp8_e4m3_encode(v[k] / s);
  }
}

}  // namespace cpu_reference
}  // namespace moekit
