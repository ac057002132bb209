// How the GPU layer holds OCP MX experts for the bulk kernels' MX instances
// (plan::ExpertKernel::mx; docs/decisions/mx_experts.md): the checkpoint's packed rows and e8m0
// scale bytes regrouped by work item (16 rows) and row chunk, so that a ring stage is one copy of
// weights and one of scales, and the packed bytes reordered within each 4-byte word so that a
// few shifts and masks make bf16 pairs in natural element order (experts_mx.cuh). Host code
// (the upload) and device code (the kernels' constants) share it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moekit/weights.h"

namespace moekit::cuda {

// Packed bytes of one row chunk of the MX ring (experts_bulk_layout.cuh, Ring::MxWeightsOnly).
inline constexpr int kMxChunkBytes = 2048;

// Elements per packed byte: 2 (MXFP4) or 1 (MXFP8).
constexpr int mx_elems_per_byte(ExpertFormat f) { return f == ExpertFormat::Mxfp4 ? 2 : 1; }

// e8m0 bytes of one row chunk: one per 32 elements of its kMxChunkBytes bytes (128 or 64).
constexpr int mx_chunk_scale_bytes(ExpertFormat f) {
  return kMxChunkBytes * mx_elems_per_byte(f) / kMxGroup;
}

// Row chunks of a row of k elements.
constexpr int mx_row_chunks(ExpertFormat f, int k) {
  return (k / mx_elems_per_byte(f) + kMxChunkBytes - 1) / kMxChunkBytes;
}

// A matrix's tiles: 16 weight rows each, the rows of one work item. Gate/up ([2I, k]: gate rows,
// then up rows): tile j holds gate rows 8j..8j+7, then up rows 8j..8j+7; down: rows 16j..16j+15.
// Row i (0..15) of tile j of a matrix of `rows` rows:
constexpr int mx_tile_row(bool gate_up, int rows, int j, int i) {
  return gate_up ? (i < 8 ? 8 * j + i : rows / 2 + 8 * j + (i - 8)) : 16 * j + i;
}

// The packed rows [rows, row_bytes] of one matrix in the kernels' layout: tile-major, then row
// chunk, then the tile's 16 rows' bytes of that chunk back to back (a row's chunk c holds
// min(kMxChunkBytes, row_bytes - c kMxChunkBytes) bytes), so that a ring stage's weights are one
// bulk copy. dst holds rows * row_bytes bytes, as src.
inline void mx_tile_rows(ExpertFormat f, bool gate_up, int rows, int k, const uint8_t* src,
                         uint8_t* dst) {
  const size_t row_bytes = mx_row_bytes(f, static_cast<size_t>(k));
  for (int j = 0; j < rows / 16; ++j) {
    uint8_t* tile = dst + static_cast<size_t>(j) * 16 * row_bytes;
    for (size_t off = 0; off < row_bytes; off += kMxChunkBytes) {
      const size_t bytes = std::min<size_t>(kMxChunkBytes, row_bytes - off);
      for (int i = 0; i < 16; ++i) {
        std::memcpy(tile + 16 * off + i * bytes,
                    src + static_cast<size_t>(mx_tile_row(gate_up, rows, j, i)) * row_bytes + off,
                    bytes);
      }
    }
  }
}

// Bytes of one matrix's scales in the kernels' layout: tile-major, then row chunk, then the
// tile's 16 rows' mx_chunk_scale_bytes(f) bytes of that chunk (zero past the row's end), one
// bulk copy per stage.
constexpr size_t mx_scale_layout_bytes(ExpertFormat f, int rows, int k) {
  return static_cast<size_t>(mx_row_chunks(f, k)) * rows * mx_chunk_scale_bytes(f);
}

// The checkpoint's scales [rows, k/32] of one matrix into that layout.
inline void mx_tile_scales(ExpertFormat f, bool gate_up, int rows, int k, const uint8_t* src,
                           uint8_t* dst) {
  const int groups = k / kMxGroup, per_chunk = mx_chunk_scale_bytes(f);
  const int chunks = mx_row_chunks(f, k);
  for (int j = 0; j < rows / 16; ++j) {
    for (int c = 0; c < chunks; ++c) {
      for (int i = 0; i < 16; ++i) {
        const size_t row = static_cast<size_t>(mx_tile_row(gate_up, rows, j, i));
        uint8_t* out = dst + ((static_cast<size_t>(j) * chunks + c) * 16 + i) * per_chunk;
        for (int b = 0; b < per_chunk; ++b) {
          const int group = c * per_chunk + b;
          out[b] = group < groups ? src[row * groups + group] : 0;
        }
      }
    }
  }
}

// MXFP4's bit placement: bf16 pair j (elements 2j, 2j + 1) of a word takes each element's
// magnitude bits (e2m1 bits 0..2) to bits 6..8 of its 16-bit lane and its sign to bit 15, i.e.
// to kMxfp4Pair's bits, from the word rotated left by mx_fp4_rotate(j), one rotation and one
// mask a pair; no four rotations of one mask tile a word's 32 bits, so pair 3 takes its sign and
// low magnitude bits from one rotation and its top magnitude bit from another.
inline constexpr uint32_t kMxfp4Pair = 0x81c081c0u;
inline constexpr uint32_t kMxfp4Pair3Low = 0x80c080c0u;  // pair 3's bits from rotation 6
inline constexpr int kMxfp4Rotate3Top = 14;              // pair 3's bits 8 and 24

constexpr int mx_fp4_rotate(int j) { return j == 0 ? 0 : j == 1 ? 4 : j == 2 ? 10 : 6; }
constexpr uint32_t mx_rotl(uint32_t x, int s) { return s == 0 ? x : (x << s) | (x >> (32 - s)); }

// The rotation of the word that gives bit `bit` (of kMxfp4Pair) of pair j.
constexpr int mx_fp4_rotation(int j, int bit) {
  return j == 3 && (kMxfp4Pair3Low >> bit & 1) == 0 ? kMxfp4Rotate3Top : mx_fp4_rotate(j);
}

// The kernels' order of the packed bytes of one 4-byte word w (little-endian, as loaded):
//   MXFP8, e4m3 elements e0..e3 in bytes 0..3 -> bytes (e2, e0, e3, e1);
//   MXFP4, e2m1 elements e0..e7 (e2i the low nibble of byte i, e2i+1 its high nibble) -> each
//   element bit at the position its pair's rotation (mx_fp4_rotation) brings to its bf16 bit.
// why: a bf16 pair (e2j, e2j+1) then comes from one shifted copy of the word and one mask
// (MXFP4 pair 3: two of each) (experts_mx.cuh).
constexpr uint32_t mx_kernel_word(ExpertFormat f, uint32_t w) {
  if (f == ExpertFormat::Mxfp8) {
    const uint32_t e0 = w & 0xff, e1 = (w >> 8) & 0xff, e2 = (w >> 16) & 0xff, e3 = w >> 24;
    return e2 | (e0 << 8) | (e3 << 16) | (e1 << 24);
  }
  uint32_t out = 0;
  for (int j = 0; j < 4; ++j) {
    for (int bit = 0; bit < 32; ++bit) {
      if ((kMxfp4Pair >> bit & 1) == 0) continue;
      // bf16 bit 6..8 <- e2m1 bit 0..2, bit 15 <- bit 3; the high lane holds element 2j + 1
      const int lane_bit = bit & 15, element = 2 * j + (bit >> 4);
      const int code_bit = lane_bit == 15 ? 3 : lane_bit - 6;
      const uint32_t code = (w >> (4 * element)) & 0xf;
      const int at = (bit - mx_fp4_rotation(j, bit) + 32) % 32;
      out |= ((code >> code_bit) & 1u) << at;
    }
  }
  return out;
}

// Bf16 pair p (elements 2p, 2p + 1) of a 16-byte piece in the kernels' byte order (its four
// words w), each element's value x 2^-120 (MXFP8) or x 2^-126 (MXFP4), exactly: an e4m3 byte b
// in the high byte of a 16-bit lane becomes sign | (b & 0x7f) << 4 for every code, subnormals
// included (bf16's exponent field is e4m3's plus 120); an e2m1 nibble n becomes
// sign | (n & 7) << 6 (bf16's exponent field is e2m1's plus 126, its subnormal 0.5 the
// exponent-0 code).
constexpr uint32_t mx_pair_bits(ExpertFormat f, const uint32_t (&w)[4], int p) {
  if (f == ExpertFormat::Mxfp8) {
    // word q = elements 4q..4q+3 as bytes (e2, e0, e3, e1): bytes 1 and 3 hold pair 2q, and
    // bytes 0 and 2, moved up a byte, pair 2q + 1
    const uint32_t v = (p & 1) != 0 ? w[p >> 1] << 8 : w[p >> 1];
    return ((v >> 4) & 0x07f007f0u) | (v & 0x80008000u);
  }
  // word q = elements 8q..8q+7, pair j = p % 4 of it
  const uint32_t q = w[p >> 2];
  const int j = p & 3;
  if (j < 3) return mx_rotl(q, mx_fp4_rotate(j)) & kMxfp4Pair;
  return (mx_rotl(q, mx_fp4_rotate(3)) & kMxfp4Pair3Low) |
         (mx_rotl(q, kMxfp4Rotate3Top) & (kMxfp4Pair & ~kMxfp4Pair3Low));
}

}  // namespace moekit::cuda
