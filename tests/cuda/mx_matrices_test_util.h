// Random packed MX experts for the prefill path's MX tests: the checkpoint's natural layout (for
// the CPU reference) and the MX kernels' layout (tiled, words reordered: experts_mx_layout.h)
// that the GPU reads.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "cuda/experts/experts_mx_layout.h"
#include "moekit/expert_format.h"

namespace moekit::test {

struct RandomMxExperts {
  ExpertFormat f;
  bool gate_up;
  int rows, k, experts;
  size_t row_bytes, groups, bytes, scale_bytes, layout_scales;  // per expert
  std::vector<uint8_t> q, s;                 // natural: [experts][rows][row_bytes], [..][groups]
  std::vector<uint8_t> tiled, tiled_scales;  // the kernels' layout

  // scale(i, rng): the e8m0 byte of scale i (over all experts' [rows][groups]).
  RandomMxExperts(ExpertFormat format, bool is_gate_up, int n_rows, int n_k, int n_experts,
                  unsigned seed, const std::function<uint8_t(size_t, std::mt19937&)>& scale)
      : f(format), gate_up(is_gate_up), rows(n_rows), k(n_k), experts(n_experts) {
    row_bytes = mx_row_bytes(f, k);
    groups = k / kMxGroup;
    bytes = rows * row_bytes;
    scale_bytes = rows * groups;
    layout_scales = cuda::mx_scale_layout_bytes(f, rows, k);
    std::mt19937 rng(seed);
    q.resize(experts * bytes);
    s.resize(experts * scale_bytes);
    for (uint8_t& b : q) {
      b = static_cast<uint8_t>(rng());
      if (f == ExpertFormat::Mxfp8 && (b & 0x7f) == 0x7f) b ^= 1;  // (no e4m3 NaN)
    }
    for (size_t i = 0; i < s.size(); ++i) s[i] = scale(i, rng);
    tiled.resize(q.size());
    tiled_scales.resize(experts * layout_scales);
    for (int e = 0; e < experts; ++e) {
      cuda::mx_tile_rows(f, gate_up, rows, k, q.data() + e * bytes, tiled.data() + e * bytes);
      cuda::mx_tile_scales(f, gate_up, rows, k, s.data() + e * scale_bytes,
                           tiled_scales.data() + e * layout_scales);
    }
    for (size_t i = 0; i < tiled.size(); i += 4) {
      uint32_t w;
      std::memcpy(&w, tiled.data() + i, 4);
      w = cuda::mx_kernel_word(f, w);
      std::memcpy(tiled.data() + i, &w, 4);
    }
  }
};

}  // namespace moekit::test
