// The fast CPU layer's projections on MX weights (expert_jobs.cpp): rows of an MX matrix against
// a job's tokens, through the fused decode kernels at 1-2 tokens (kernels.h dot_rows_mx*) and
// otherwise 4 rows at a time dequantised (dequant_mx*_row) into a per-thread bf16 buffer for the
// bf16 kernels. Both give each output element the sum the bf16 kernels give on the dequantised
// rows, so the layer on MX weights equals it on their bf16 load bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/fast/kernels.h"
#include "moekit/weights.h"

namespace moekit::cpu_fast::detail {

// An MX matrix: row r holds mx_row_bytes(format, cols) bytes at q + r * that, its cols / 32 e8m0
// bytes at scale + r * cols / 32.
struct MxMatrix {
  ExpertFormat format = ExpertFormat::Bf16;
  const uint8_t* q = nullptr;
  const uint8_t* scale = nullptr;
  size_t cols = 0;

  bool empty() const { return q == nullptr; }
  // The matrix starting `rows` rows further down.
  MxMatrix offset_rows(size_t rows) const {
    return {format, q + rows * mx_row_bytes(format, cols), scale + rows * (cols / kMxGroup), cols};
  }
};

// out[j * ldo + (r - r0)] = sum_{c < k} w[r][c] x[j][c] for r in [r0, r1), j < n: x as bf16
// (xb, with vdpbf16ps: kern.dot_rows_bf16) when xb is non-null, else as fp32 (xf).
void mx_project(const Kernels& kern, const MxMatrix& w, int r0, int r1, int k,
                const float* const* xf, const Bf16* const* xb, int n, float* out, size_t ldo);

}  // namespace moekit::cpu_fast::detail
