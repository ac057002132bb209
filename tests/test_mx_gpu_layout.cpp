// The GPU layer's layout of MX experts and the MX kernels' bit moves
// (src/cuda/experts/experts_mx_layout.h), host-only: every e4m3 and e2m1 code through the
// kernels' byte order and pair extraction gives its value x 2^-120 / x 2^-126 as bf16 bits, in
// natural element order; the tiles of rows and of scale bytes hold what the layout says.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "cuda/experts/experts_mx_layout.h"
#include "moekit/memory_estimate.h"
#include "moekit/spec.h"
#include "mx_test_util.h"
#include "plan/expert_rules.h"

namespace moekit {
namespace {

using namespace moekit::cuda;

float bf16_bits_value(uint32_t bits16) {
  const uint32_t f = bits16 << 16;
  float v;
  std::memcpy(&v, &f, 4);
  return v;
}

// The piece of 16 natural bytes in the kernels' order, its pair p's two values (x 2^bias).
std::pair<float, float> pair_values(ExpertFormat f, const uint8_t (&bytes)[16], int p, int bias) {
  uint32_t w[4];
  std::memcpy(w, bytes, 16);
  for (uint32_t& x : w) x = mx_kernel_word(f, x);
  const uint32_t bits = mx_pair_bits(f, w, p);
  return {std::ldexp(bf16_bits_value(bits & 0xffff), bias),
          std::ldexp(bf16_bits_value(bits >> 16), bias)};
}

TEST(MxGpuLayout, EveryE4m3CodeComesOutExactlyInElementOrder) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;  // (NaN: refused at load)
    for (int pos = 0; pos < 16; ++pos) {
      uint8_t bytes[16];
      for (int i = 0; i < 16; ++i) bytes[i] = static_cast<uint8_t>(0x38 + i);  // distinct codes
      bytes[pos] = static_cast<uint8_t>(code);
      for (int p = 0; p < 8; ++p) {
        const auto [a, b] = pair_values(ExpertFormat::Mxfp8, bytes, p, 120);
        ASSERT_EQ(a, test::e4m3_decode(bytes[2 * p])) << "code " << code << " at " << pos;
        ASSERT_EQ(b, test::e4m3_decode(bytes[2 * p + 1])) << "code " << code << " at " << pos;
      }
    }
  }
}

TEST(MxGpuLayout, EveryE2m1PairComesOutExactlyInElementOrder) {
  for (int byte = 0; byte < 256; ++byte) {
    for (int pos = 0; pos < 16; ++pos) {
      uint8_t bytes[16];
      for (int i = 0; i < 16; ++i) bytes[i] = static_cast<uint8_t>(17 * i);
      bytes[pos] = static_cast<uint8_t>(byte);
      for (int p = 0; p < 16; ++p) {
        const auto [a, b] = pair_values(ExpertFormat::Mxfp4, bytes, p, 126);
        ASSERT_EQ(a, test::e2m1_decode(bytes[p] & 15)) << "byte " << byte << " at " << pos;
        ASSERT_EQ(b, test::e2m1_decode(bytes[p] >> 4)) << "byte " << byte << " at " << pos;
      }
    }
  }
}

// A gate/up matrix of 2I = 32 rows (two tiles) and a down matrix of 16 rows, rows of 2 chunks
// and a partial third: row i of tile j, chunk c at 16 c 2048 + i * (that chunk's bytes).
TEST(MxGpuLayout, TilesHoldTheItemsRowsChunkByChunk) {
  for (const ExpertFormat f : {ExpertFormat::Mxfp8, ExpertFormat::Mxfp4}) {
    const int k = f == ExpertFormat::Mxfp8 ? 4160 : 8320;  // 4160 bytes a row: 2048 + 2048 + 64
    const size_t row_bytes = mx_row_bytes(f, k);
    for (const bool gate_up : {true, false}) {
      const int rows = gate_up ? 32 : 16;
      std::vector<uint8_t> src(rows * row_bytes), dst(src.size());
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + i / 4096);
      mx_tile_rows(f, gate_up, rows, k, src.data(), dst.data());
      for (int j = 0; j < rows / 16; ++j) {
        for (int i = 0; i < 16; ++i) {
          const int row = gate_up ? (i < 8 ? 8 * j + i : rows / 2 + 8 * j + i - 8) : 16 * j + i;
          for (int c = 0; c < 3; ++c) {
            const size_t bytes = c < 2 ? 2048 : 64;
            const uint8_t* got = dst.data() + j * 16 * row_bytes + 16 * 2048 * c + i * bytes;
            ASSERT_EQ(std::memcmp(got, src.data() + row * row_bytes + 2048 * c, bytes), 0)
                << expert_format_name(f) << " tile " << j << " row " << i << " chunk " << c;
          }
        }
      }
      // scales: tile, chunk, the 16 rows' bytes of the chunk, zero past the row's groups
      const int groups = k / 32, per_chunk = mx_chunk_scale_bytes(f);
      std::vector<uint8_t> s(rows * groups), t(mx_scale_layout_bytes(f, rows, k), 0xee);
      for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(1 + i % 251);
      mx_tile_scales(f, gate_up, rows, k, s.data(), t.data());
      for (int j = 0; j < rows / 16; ++j) {
        for (int c = 0; c < 3; ++c) {
          for (int i = 0; i < 16; ++i) {
            const int row = gate_up ? (i < 8 ? 8 * j + i : rows / 2 + 8 * j + i - 8) : 16 * j + i;
            for (int b = 0; b < per_chunk; ++b) {
              const int group = c * per_chunk + b;
              ASSERT_EQ(t[((j * 3 + c) * 16 + i) * per_chunk + b],
                        group < groups ? s[row * groups + group] : 0)
                  << expert_format_name(f) << " tile " << j << " chunk " << c << " row " << i;
            }
          }
        }
      }
    }
  }
}

// The GPU layer's device-memory estimate counts MX experts in their packed bytes and an e8m0
// byte per 32 elements (and, as fp8, no unfused shared MLP): only the weights differ from bf16's.
TEST(MxGpuLayout, DeviceBytesCountThePackedExperts) {
  for (const auto& [model, f] : {std::pair{"gpt-oss-120b", ExpertFormat::Mxfp4},
                                 std::pair{"minimax-m3", ExpertFormat::Mxfp8}}) {
    const MoeSpec spec = load_spec(model);
    const size_t H = spec.hidden, I = spec.expert_intermediate;
    const size_t rows = spec.num_experts + (spec.can_fuse_shared() ? spec.shared_slots() : 0);
    const size_t Is = spec.shared_kind != SharedKind::None ? spec.shared_intermediate : 0;
    const size_t bf16 = gpu_layer_device_bytes(spec, 64, DType::BF16);
    const size_t mx = gpu_layer_device_bytes(spec, 64, DType::BF16, f);
    const size_t packed = 3 * I * mx_row_bytes(f, H) + 3 * I * H / kMxGroup;
    EXPECT_EQ(bf16 - mx, rows * (3 * I * H * 2 - packed) + 3 * Is * H * 2) << model;
    // at 8192 tokens the prefill path runs, and MX widens a run of experts to bf16 beside it (at
    // 4096, 128 routed tokens per expert, the packed GEMM widens nothing)
    const size_t chunk = static_cast<size_t>(plan::experts_grouped_mx_chunk(
        static_cast<int>(rows), static_cast<int>(H), static_cast<int>(I), -1));
    EXPECT_GE(chunk, 1u) << model;
    EXPECT_EQ(gpu_layer_device_bytes(spec, 8192, DType::BF16) + chunk * 2 * I * H * 2 -
                  gpu_layer_device_bytes(spec, 8192, DType::BF16, f),
              rows * (3 * I * H * 2 - packed) + 3 * Is * H * 2)
        << model;
    // the run the layer's plan holds (a MOEKIT_EXPERTS_MX_CHUNK override; 0: not that path)
    const size_t mx8192 = gpu_layer_device_bytes(spec, 8192, DType::BF16, f);
    EXPECT_EQ(gpu_layer_device_bytes(spec, 8192, DType::BF16, f, 3) + (chunk - 3) * 2 * I * H * 2,
              mx8192)
        << model;
    EXPECT_EQ(gpu_layer_device_bytes(spec, 64, DType::BF16, f, 5), mx + 5 * 2 * I * H * 2) << model;
    EXPECT_EQ(gpu_layer_device_bytes(spec, 8192, DType::BF16, f, 0), mx8192 - chunk * 2 * I * H * 2)
        << model;
    EXPECT_EQ(gpu_layer_device_bytes(spec, 4096, DType::BF16, f),
              gpu_layer_device_bytes(spec, 4096, DType::BF16, f, 0))
        << model;
  }
}

}  // namespace
}  // namespace moekit
