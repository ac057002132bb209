// MX arithmetic of the CPU reference (reference_mx.h).
#include "cpu/reference_mx.h"

#include <cmath>

namespace moekit::cpu_reference {

float e2m1_value(uint8_t code) {
  // sign, 2 exponent bits (bias 1), 1 mantissa bit; exponent 0 is the subnormal 0 / 0.5
  const int e = (code >> 1) & 3, m = code & 1;
  const float v = e == 0 ? 0.5f * m : std::ldexp(1.0f + 0.5f * m, e - 1);
  return (code & 8) ? -v : v;
}

void dequant_row_mx(const MxRows& w, size_t r, int n, Bf16* out) {
  const uint8_t* q = w.q + r * w.ld;
  const uint8_t* s = w.scale + r * w.scale_ld;
  const bool fp4 = w.format == ExpertFormat::Mxfp4;
  for (int k = 0; k < n; ++k) {
    const float element = fp4 ? e2m1_value((q[k / 2] >> (4 * (k % 2))) & 15)
                              : fp8_e4m3_to_float(q[k]);
    out[k] = float_to_bf16(element * std::ldexp(1.0f, static_cast<int>(s[k / kMxGroup]) - 127));
  }
}

}  // namespace moekit::cpu_reference
