// Element conversions for checkpoint tensors (see tensor_convert.h).
#include "io/tensor_convert.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "moekit/error.h"

namespace moekit::io {
namespace {

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_float(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

// e2m1 values by nibble (sign bit 3), as the OCP microscaling spec and transformers' gpt-oss
// dequantisation (convert_moe_packed_tensors) define them.
constexpr float kFp4Values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

// Round to nearest even on the bits: below 2^-6 the codes 0..8 are the multiples of 2^-9 (8 is
// the smallest normal), above it code = (exponent + 7) << 3 | the top 3 mantissa bits, rounded on
// the other 20 (a carry runs into the exponent, the codes being consecutive).
uint8_t fp8_e4m3_encode(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag > 0x7f800000u) return 0x7f;          // NaN
  if (mag >= 0x43e00000u) return sign | 0x7e;  // >= 448 (and infinity): saturated
  if (mag < 0x3c800000u) {                     // < 2^-6
    float a;
    std::memcpy(&a, &mag, 4);
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  const uint32_t mant = mag & 0x7fffffu, rest = mant & 0xfffffu;
  uint32_t code = ((((mag >> 23) - 127 + 7) << 3) | (mant >> 20));
  if (rest > 0x80000u || (rest == 0x80000u && (code & 1) != 0)) ++code;
  return sign | static_cast<uint8_t>(code);
}

float fp8_e4m3_value(uint8_t bits) { return fp8_table()[bits]; }

float e8m0_value(uint8_t b) { return b == 255 ? NAN : std::ldexp(1.0f, static_cast<int>(b) - 127); }

bool is_scale_dtype(const std::string& d) {
  return d == "F32" || d == "BF16" || d == "F16" || d == "F8_E8M0";
}

float scale_value(const std::string& d, const void* data, size_t i, const std::string& what) {
  // (load_as_float: at any alignment, as the file gives it)
  float v = 0;
  if (d == "F32")
    v = load_as_float(DType::F32, data, i);
  else if (d == "BF16")
    v = load_as_float(DType::BF16, data, i);
  else if (d == "F16")
    v = load_as_float(DType::F16, data, i);
  else if (d == "F8_E8M0")
    v = e8m0_value(static_cast<const uint8_t*>(data)[i]);
  else
    MK_FAIL("scale tensor " << what << " has dtype " << d
                            << ", expected F32, BF16, F16 or F8_E8M0");
  // A NaN, infinite or negative block scale turns a whole block of weights into garbage.
  MK_CHECK(std::isfinite(v) && v >= 0.0f, "scale tensor " << what << ": element " << i << " is "
                                                          << v
                                                          << ", expected a finite scale >= 0");
  return v;
}

void convert_to_bf16(DType t, const void* src, size_t count, Bf16* out) {
  switch (t) {
    case DType::BF16:
      std::memcpy(out, src, count * 2);
      return;
    case DType::F16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, static_cast<const uint8_t*>(src) + 2 * i, 2);
        out[i] = float_to_bf16(f16_to_float(h));
      }
      return;
    case DType::F32:
      for (size_t i = 0; i < count; ++i) {
        float f;
        std::memcpy(&f, static_cast<const uint8_t*>(src) + 4 * i, 4);
        out[i] = float_to_bf16(f);
      }
      return;
    case DType::F8_E4M3:
      break;
  }
  MK_FAIL("convert_to_bf16: F8_E4M3 needs its block scale (dequant_fp8_block)");
}

void convert_to_f32(DType t, const void* src, size_t count, float* out) {
  switch (t) {
    case DType::F32:
      std::memcpy(out, src, count * 4);
      return;
    case DType::BF16:
    case DType::F16:
      for (size_t i = 0; i < count; ++i) out[i] = load_as_float(t, src, i);
      return;
    case DType::F8_E4M3:
      break;
  }
  MK_FAIL("convert_to_f32: F8_E4M3 needs its block scale");
}

void dequant_fp8_block(const uint8_t* src, size_t rows, size_t cols, const std::string& scale_dtype,
                       const void* scale, size_t scale_offset, Bf16* out, const std::string& what) {
  const auto& lut = fp8_table();
  const size_t kb = ceil_div(cols, kFp8Block);
  std::vector<float> row_scales(kb);
  for (size_t r = 0; r < rows; ++r) {
    if (r % kFp8Block == 0) {
      for (size_t b = 0; b < kb; ++b)
        row_scales[b] =
            scale_value(scale_dtype, scale, scale_offset + (r / kFp8Block) * kb + b, what);
    }
    const uint8_t* s = src + r * cols;
    Bf16* o = out + r * cols;
    for (size_t c = 0; c < cols; ++c) o[c] = float_to_bf16(lut[s[c]] * row_scales[c / kFp8Block]);
  }
}

void decode_mxfp4_row(const uint8_t* blocks, const float* scales, size_t groups, float* out) {
  for (size_t g = 0; g < groups; ++g) {
    const float s = scales[g];
    for (size_t b = 0; b < 16; ++b) {
      const uint8_t byte = blocks[g * 16 + b];
      out[g * 32 + 2 * b] = kFp4Values[byte & 0x0f] * s;
      out[g * 32 + 2 * b + 1] = kFp4Values[byte >> 4] * s;
    }
  }
}

void quantize_fp8_block(const Bf16* src, size_t rows, size_t cols, uint8_t* q_out,
                        float* scale_out, bool pow2) {
  const size_t rb = ceil_div(rows, kFp8Block), kb = ceil_div(cols, kFp8Block);
  for (size_t i = 0; i < rb; ++i) {
    for (size_t j = 0; j < kb; ++j) {
      const size_t r1 = std::min(rows, (i + 1) * kFp8Block),
                   c1 = std::min(cols, (j + 1) * kFp8Block);
      float amax = 0.0f;
      for (size_t r = i * kFp8Block; r < r1; ++r)
        for (size_t c = j * kFp8Block; c < c1; ++c)
          amax = std::max(amax, std::fabs(bf16_to_float(src[r * cols + c])));
      float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
      if (pow2) {
        int e = 0;
        const float m = std::frexp(scale, &e);  // scale = m 2^e, m in [0.5, 1)
        scale = std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
      }
      scale_out[i * kb + j] = scale;
      for (size_t r = i * kFp8Block; r < r1; ++r)
        for (size_t c = j * kFp8Block; c < c1; ++c)
          q_out[r * cols + c] = fp8_e4m3_encode(bf16_to_float(src[r * cols + c]) / scale);
    }
  }
}

}  // namespace moekit::io
