// fp8 row dequantisation without intrinsics (kernels.h, dequant_fp8_row): a 256-entry table of
// the e4m3fn values, the tile scale, and bf16's round to nearest even.
#include <array>

#include "cpu/fast/kernels.h"

namespace moekit::cpu_fast::detail {

void dequant_fp8_row_portable(const uint8_t* q, const float* scale, int k, Bf16* out) {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_float(static_cast<uint8_t>(i));
    return t;
  }();
  for (int c = 0; c < k; ++c) out[c] = float_to_bf16(table[q[c]] * scale[c >> 7]);
}

}  // namespace moekit::cpu_fast::detail
