// The MX arithmetic of the CPU reference (reference_layer.cpp): reading rows of an OCP MX matrix
// (MXFP4 e2m1 pairs or MXFP8 e4m3 bytes, one e8m0 exponent byte per 32 columns) as bf16. The
// reference computes with them weight-only (W4A16 / W8A16): each row dequantised exactly, then
// the bf16 MLP, with the bf16 activations as they are.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moekit/dtype.h"
#include "moekit/weights.h"

namespace moekit::cpu_reference {

// One MX matrix: row r is q + r * ld bytes, its e8m0 bytes scale + r * scale_ld.
struct MxRows {
  ExpertFormat format = ExpertFormat::Mxfp8;
  const uint8_t* q = nullptr;
  const uint8_t* scale = nullptr;
  size_t ld = 0;
  size_t scale_ld = 0;
};

// e2m1 code (low 4 bits) -> value, exact.
float e2m1_value(uint8_t code);

// out[k] = bf16(element(r, k) x 2^(scale[r][k / 32] - 127)) for k < n, rounded to nearest even:
// the product is exact in fp32 (e2m1 / e4m3 carry at most 4 significant bits and the smallest,
// 2^-9 x 2^-127, is above fp32's 2^-149), and so is its bf16 rounding unless it lies below
// bf16's normal range (2^-126). This equals a bf16 load of the same checkpoint.
void dequant_row_mx(const MxRows& w, size_t r, int n, Bf16* out);

}  // namespace moekit::cpu_reference
