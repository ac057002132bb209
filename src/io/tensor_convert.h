// Element conversions for checkpoint tensors: any float dtype moekit reads -> bf16 / fp32, the
// DeepSeek 128x128 fp8 block dequantisation, and the OCP MXFP4 (e2m1 + e8m0 per 32) decoding of
// gpt-oss checkpoints. Scalar loops with lookup tables: a conversion runs once per expert.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "moekit/dtype.h"

namespace moekit::io {

constexpr int kFp8Block = 128;  // DeepSeek-V3 weight block (rows and columns)
constexpr int kMxBlock = 32;    // MXFP4 elements per e8m0 scale

// fp8 e4m3fn byte -> float, through a table.
float fp8_e4m3_value(uint8_t bits);

// float -> fp8 e4m3fn, round to nearest even, saturating at +-448, NaN -> 0x7f; the sign of zero
// is kept.
uint8_t fp8_e4m3_encode(float f);

// Element i of a block-scale tensor stored as F32, BF16, F16 or F8_E8M0 (2^(b-127); 255 = NaN).
// dtype_name is the safetensors spelling; others throw naming `what`.
float scale_value(const std::string& dtype_name, const void* data, size_t i,
                  const std::string& what);
bool is_scale_dtype(const std::string& dtype_name);

// Converts count elements of src (BF16, F16, F32; not F8) to bf16 / fp32.
void convert_to_bf16(DType src_type, const void* src, size_t count, Bf16* out);
void convert_to_f32(DType src_type, const void* src, size_t count, float* out);

// out[r][c] = bf16(fp8(src[r][c]) * scale[r/128][c/128]) for a [rows, cols] fp8 matrix whose
// scale grid is [ceil(rows/128), ceil(cols/128)] (scale_offset: elements to skip in the scale
// tensor, for stacked experts).
void dequant_fp8_block(const uint8_t* src, size_t rows, size_t cols, const std::string& scale_dtype,
                       const void* scale, size_t scale_offset, Bf16* out, const std::string& what);

// e8m0 scale byte -> 2^(b-127) (255 = NaN).
float e8m0_value(uint8_t b);

// One MXFP4 row: groups x 16 bytes of e2m1 pairs (low nibble = even element), one scale per
// group of 32 -> 32*groups floats (exact in bf16 when the scales are powers of two).
void decode_mxfp4_row(const uint8_t* blocks, const float* scales, size_t groups, float* out);

// Quantises a bf16 [rows, cols] matrix to fp8 e4m3 with 128x128 block scales amax / 448 (scale 1
// for an all-zero block; pow2: rounded up to a power of two, as scale_fmt ue8m0 stores them);
// scale_out has ceil(rows/128) * ceil(cols/128) entries.
void quantize_fp8_block(const Bf16* src, size_t rows, size_t cols, uint8_t* q_out,
                        float* scale_out, bool pow2 = false);

inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace moekit::io
