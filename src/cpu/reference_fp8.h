// The fp8 arithmetic of the CPU reference (reference_layer.cpp): reading rows of a 128x128
// block-scaled e4m3 matrix, and the two ways the reference computes with them (layer.h,
// Fp8Compute): dequantise a row to bf16 (weight-only), or the W8A8 block dot product.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moekit/dtype.h"
#include "moekit/weights.h"

namespace moekit::cpu_reference {

// One e4m3 matrix with its tile scales: row r is q + r * ld, the scales of its 128-column tiles
// start at scale + (r / 128) * scale_ld. A column range of a wider matrix (the unfused shared
// down projection) is the same view with ld and scale_ld of the wider one.
struct Fp8Rows {
  const uint8_t* q = nullptr;
  const float* scale = nullptr;
  size_t ld = 0;
  size_t scale_ld = 0;

  const uint8_t* row(size_t r) const { return q + r * ld; }
  const float* row_scales(size_t r) const { return scale + (r / kFp8Tile) * scale_ld; }
};

// e4m3fn code -> value (exact; NaN codes give NaN).
float fp8_value(uint8_t code);

// Weight-only: out[k] = bf16(fp8(row[k]) * scale[k / 128]) for k < n, the value a bf16 load of
// the checkpoint holds (io::dequant_fp8_block rounds the same product the same way).
void dequant_row(const Fp8Rows& w, size_t r, int n, Bf16* out);

// W8A8: sum over the 128-wide K blocks b of (sum_k fp8(qa[k]) fp8(w[r][k])) * sa[b] * ws[r][b],
// k < n. The fp8 products are exact and each block sum is exact in double; accumulation is in
// double (the kernels' fp32 accumulation rounds where this does not).
double dot_w8a8(const Fp8Rows& w, size_t r, const uint8_t* qa, const float* sa, int n);

}  // namespace moekit::cpu_reference
