#include "moekit/dtype.h"

#include <cmath>
#include <cstring>

#include "moekit/error.h"

namespace moekit {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::F32:
      return "F32";
    case DType::F8_E4M3:
      return "F8_E4M3";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "BF16") return DType::BF16;
  if (name == "F16") return DType::F16;
  if (name == "F32") return DType::F32;
  if (name == "F8_E4M3") return DType::F8_E4M3;
  MK_FAIL("unsupported dtype '" << name << "' (moekit reads BF16, F16, F32, F8_E4M3)");
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // subnormal (or zero)
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (std::isnan(f)) return sign | 0x7e00u;
  float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to Inf
  if (a < std::ldexp(1.0f, -14)) {
    // subnormal: multiple of 2^-24, round to nearest even
    float q = std::nearbyint(std::ldexp(a, 24));
    return sign | static_cast<uint16_t>(q);
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  float q = std::nearbyint(std::ldexp(m, 11));  // 11 significant bits
  if (q >= 2048.0f) {
    q /= 2;
    e += 1;
  }
  const uint16_t exp = static_cast<uint16_t>(e - 1 + 15);
  return sign | static_cast<uint16_t>(exp << 10) | (static_cast<uint16_t>(q) & 0x3ffu);
}

float fp8_e4m3_to_float(uint8_t b) {
  const uint32_t sign = b >> 7, exp = (b >> 3) & 0xfu, mant = b & 0x7u;
  float v;
  if (exp == 15 && mant == 7) {
    v = NAN;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -9);
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x8u), static_cast<int>(exp) - 10);
  }
  return sign ? -v : v;
}

uint8_t float_to_fp8_e4m3(float f) {
  // Saturating to +-448 (test data only: saturation keeps values meaningful). The magnitude is
  // found by search over the 127 finite non-negative codes, round half to even; exact and simple,
  // speed does not matter here. The sign is copied, so -0 stays -0 and +0 stays +0.
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  uint8_t best = 0;
  float best_err = INFINITY;
  for (int c = 0; c < 127; ++c) {
    const float err = std::fabs(fp8_e4m3_to_float(static_cast<uint8_t>(c)) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best_err = err;
      best = static_cast<uint8_t>(c);
    }
  }
  return sign | best;
}

float load_as_float(DType t, const void* data, size_t i) {
  // memcpy, not a typed load: `data` may point into a file mapping at any byte offset (a
  // safetensors tensor's offsets need not be aligned; fuzz_safetensors found an F32 one at an
  // odd address, undefined behaviour under UBSan)
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  switch (t) {
    case DType::BF16: {
      Bf16 v;
      std::memcpy(&v, bytes + 2 * i, 2);
      return bf16_to_float(v);
    }
    case DType::F16: {
      uint16_t v;
      std::memcpy(&v, bytes + 2 * i, 2);
      return f16_to_float(v);
    }
    case DType::F32: {
      float v;
      std::memcpy(&v, bytes + 4 * i, 4);
      return v;
    }
    case DType::F8_E4M3:
      return fp8_e4m3_to_float(bytes[i]);
  }
  MK_FAIL("unknown dtype");
}

}  // namespace moekit
