// MX projections of the fast CPU layer (mx_rows.h).
#include "cpu/fast/mx_rows.h"

#include <algorithm>
#include <vector>

namespace moekit::cpu_fast::detail {

namespace {

// Rows per dequantisation chunk: the bf16 kernels' 4-row tiles (expert_jobs.cpp's fp8 chunks).
constexpr int kChunkRows = 4;

}  // namespace

void mx_project(const Kernels& kern, const MxMatrix& w, int r0, int r1, int k,
                const float* const* xf, const Bf16* const* xb, int n, float* out, size_t ldo) {
  const bool fp4 = w.format == ExpertFormat::Mxfp4;
  const size_t row = mx_row_bytes(w.format, w.cols), scale_row = w.cols / kMxGroup;
  const MxMatrix first = w.offset_rows(r0);
  if (n <= kern.mx_row_tokens) {
    if (xb != nullptr) {
      const auto fused = fp4 ? kern.dot_rows_mxfp4_bf16 : kern.dot_rows_mxfp8_bf16;
      if (fused != nullptr) {
        fused(first.q, row, first.scale, scale_row, r1 - r0, k, xb, n, out, ldo);
        return;
      }
    } else {
      const auto fused = fp4 ? kern.dot_rows_mxfp4_f32 : kern.dot_rows_mxfp8_f32;
      if (fused != nullptr) {
        fused(first.q, row, first.scale, scale_row, r1 - r0, k, xf, n, out, ldo);
        return;
      }
    }
  }
  // why: a grown, never shrunk buffer per thread (fast_common.h's scratch rule)
  thread_local std::vector<Bf16> buffer;
  if (buffer.size() < static_cast<size_t>(kChunkRows) * k) buffer.resize(static_cast<size_t>(kChunkRows) * k);
  const auto dequant = fp4 ? kern.dequant_mxfp4_row : kern.dequant_mxfp8_row;
  for (int a = r0; a < r1; a += kChunkRows) {
    const int b = std::min(r1, a + kChunkRows);
    for (int r = a; r < b; ++r)
      dequant(w.q + r * row, w.scale + r * scale_row, k, buffer.data() + static_cast<size_t>(r - a) * k);
    if (xb != nullptr) {
      kern.dot_rows_bf16(buffer.data(), k, b - a, k, xb, n, out + (a - r0), ldo);
    } else {
      kern.dot_rows_f32(buffer.data(), k, b - a, k, xf, n, out + (a - r0), ldo);
    }
  }
}

}  // namespace moekit::cpu_fast::detail
