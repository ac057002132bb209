// How a layer holds its expert weights (ExpertFormat) and the block sizes of the quantised
// formats: shared by the weights (moekit/weights.h), the plan and the memory estimates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace moekit {

// Rows and columns of one fp8 weight tile (weight_block_size [128, 128] of the fp8 checkpoints).
inline constexpr int kFp8Tile = 128;
// Input elements per e8m0 exponent byte in the OCP MX formats (MXFP4, MXFP8).
inline constexpr int kMxGroup = 32;

// How a layer holds its expert and shared-MLP weights (LayerWeights::expert_format()).
enum class ExpertFormat : uint8_t {
  Bf16,      // ExpertView::w13 / w2 (every checkpoint storage converted to bf16)
  Fp8Block,  // e4m3 bytes + fp32 128x128 tile scales (ExpertView's fp8 fields)
  Mxfp4,     // e2m1 pairs (low nibble first) + e8m0 bytes per 1x32 (ExpertView's mx fields)
  Mxfp8,     // e4m3 bytes + e8m0 bytes per 1x32 (ExpertView's mx fields)
};
const char* expert_format_name(ExpertFormat f);          // "bf16", "fp8", "mxfp4", "mxfp8"
ExpertFormat parse_expert_format(const std::string& s);  // throws naming s and the choices
// Bytes of a row of `cols` packed elements in an MX format (cols / 2 for Mxfp4, cols for Mxfp8).
inline size_t mx_row_bytes(ExpertFormat f, size_t cols) {
  return f == ExpertFormat::Mxfp4 ? cols / 2 : cols;
}
// Bytes of an MLP of `width` (gate and up [width, hidden], down [hidden, width]) in an MX format:
// its 3 width hidden packed elements and one e8m0 byte per 32 of them.
inline size_t mx_mlp_bytes(ExpertFormat f, size_t width, size_t hidden) {
  const size_t elements = 3 * width * hidden;
  return mx_row_bytes(f, elements) + elements / kMxGroup;
}

}  // namespace moekit
