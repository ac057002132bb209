// Element types moekit reads and computes with, and exact scalar conversions.
//
// bf16 is stored as its 16 raw bits (struct Bf16), layout-identical to CUDA's __nv_bfloat16, so
// host buffers can be copied to the device as they are. Conversions round to nearest even, the
// rounding PyTorch and the CUDA intrinsics use, so CPU and GPU see the same bf16 inputs.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace moekit {

enum class DType : uint8_t { BF16, F16, F32, F8_E4M3 };

// Bytes per element.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::BF16:
    case DType::F16:
      return 2;
    case DType::F32:
      return 4;
    case DType::F8_E4M3:
      return 1;
  }
  return 0;
}

// The safetensors spelling ("BF16", "F16", "F32", "F8_E4M3").
const char* dtype_name(DType t);
// Parses the safetensors spelling; throws moekit::Error naming the string when unknown.
DType parse_dtype(std::string_view name);

struct Bf16 {
  uint16_t bits;
};
static_assert(sizeof(Bf16) == 2, "Bf16 must be two bytes, like __nv_bfloat16");

inline float bf16_to_float(Bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN (quiet), Inf stays Inf.
inline Bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return Bf16{static_cast<uint16_t>(u >> 16)};
}

// The float nearest to f that bf16 represents exactly.
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// IEEE half (bits) and fp8 e4m3fn (bits; no Inf, 0x7f/0xff are NaN, max 448) to float.
float f16_to_float(uint16_t bits);
uint16_t float_to_f16(float f);
float fp8_e4m3_to_float(uint8_t bits);
uint8_t float_to_fp8_e4m3(float f);

// Element i of a buffer of type t, as float. For bulk work convert once, not per element.
float load_as_float(DType t, const void* data, size_t i);

}  // namespace moekit
