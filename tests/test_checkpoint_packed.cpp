// Packed expert formats in published checkpoints decode to moekit's bf16 layout: gpt-oss's MXFP4
// blocks and scales (rows interleaved gate / up), DeepSeek-V4's packed FP4 with e8m0 scales; and
// the checkpoint writer's fp8 encoder agrees with the exhaustive reference.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>

#include "io/tensor_convert.h"
#include "io_test_util.h"
#include "moekit/checkpoint.h"
#include "moekit/error.h"
#include "moekit/safetensors.h"
#include "moekit/weights.h"

using moekit::CheckpointNaming;
using moekit::DType;
using moekit::MoeSpec;
using moekit::SafetensorsFile;
using moekit::test::scratch_dir;
using moekit::test::small_spec;
using moekit::test::test_layer;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

// e2m1 codes' values (OCP MX): the low three bits' magnitude, bit 3 the sign.
const float kFp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

TEST(Checkpoint, GptOssMxfp4DecodesToMoekitLayout) {
  const MoeSpec spec = small_spec("gpt-oss-120b");
  const int L = test_layer(spec);
  const size_t E = spec.num_experts, H = spec.hidden, I = spec.expert_intermediate;
  auto w = moekit::make_random_weights(spec, L, 4);
  const std::string dir = scratch_dir();
  const std::string p = "model.layers." + std::to_string(L) + ".mlp.";
  // Blocks: nibbles and scales from a simple hash; the expected value of element (row, k) is
  // fp4[nibble] * 2^(scale - 127), with element 2b in the low nibble of byte b.
  auto nibble = [](size_t row, size_t k) { return uint8_t((row * 7 + k * 13 + k / 5) % 16); };
  auto scale = [](size_t row, size_t g) { return uint8_t(120 + (row + 3 * g) % 9); };
  auto value = [&](size_t row, size_t k) {
    return kFp4[nibble(row, k)] * std::ldexp(1.0f, int(scale(row, k / 32)) - 127);
  };
  auto blocks = [&](size_t rows, size_t cols, std::vector<uint8_t>& b, std::vector<uint8_t>& s) {
    b.assign(rows * cols / 2, 0);
    s.assign(rows * cols / 32, 0);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t k = 0; k < cols; k += 2)
        b[(r * cols + k) / 2] = uint8_t(nibble(r, k) | (nibble(r, k + 1) << 4));
      for (size_t g = 0; g < cols / 32; ++g) s[r * (cols / 32) + g] = scale(r, g);
    }
  };
  std::vector<uint8_t> gub, gus, dnb, dns;
  blocks(E * 2 * I, H, gub, gus);  // rows: expert-major, then 2I interleaved gate/up rows
  blocks(E * H, I, dnb, dns);
  const int64_t e = E, h = H, i = I;
  std::vector<float> gu_bias(E * 2 * I, 0.25f), dn_bias(E * H, -0.5f);
  std::vector<float> router(E * H, 0.01f), router_bias(E, 0.0f);
  std::map<std::string, moekit::SafetensorsWriteTensor> t;
  // U8 is not a moekit DType: the writer only writes F8_E4M3 (1 byte), then the header is patched.
  t[p + "experts.gate_up_proj_blocks"] = {
      DType::F8_E4M3, {e, 2 * i, h / 32, 16}, moekit::as_bytes_span(gub.data(), gub.size())};
  t[p + "experts.gate_up_proj_scales"] = {
      DType::F8_E4M3, {e, 2 * i, h / 32}, moekit::as_bytes_span(gus.data(), gus.size())};
  t[p + "experts.down_proj_blocks"] = {
      DType::F8_E4M3, {e, h, i / 32, 16}, moekit::as_bytes_span(dnb.data(), dnb.size())};
  t[p + "experts.down_proj_scales"] = {
      DType::F8_E4M3, {e, h, i / 32}, moekit::as_bytes_span(dns.data(), dns.size())};
  t[p + "experts.gate_up_proj_bias"] = {
      DType::F32, {e, 2 * i}, moekit::as_bytes_span(gu_bias.data(), gu_bias.size())};
  t[p + "experts.down_proj_bias"] = {
      DType::F32, {e, h}, moekit::as_bytes_span(dn_bias.data(), dn_bias.size())};
  t[p + "router.weight"] = {
      DType::F32, {e, h}, moekit::as_bytes_span(router.data(), router.size())};
  t[p + "router.bias"] = {
      DType::F32, {e}, moekit::as_bytes_span(router_bias.data(), router_bias.size())};
  const std::string file = dir + "/model.safetensors";
  moekit::write_safetensors(file, t);
  moekit::test::replace_in_file(file, "\"F8_E4M3\"", "\"U8\"     ");  // same length: offsets hold

  auto l = moekit::load_checkpoint_weights(spec, L, dir);
  EXPECT_THAT(l->origin(), HasSubstr("gpt-oss mxfp4 experts"));
  for (size_t ex : {size_t{0}, E - 1}) {
    const auto v = l->expert(int(ex));
    for (size_t r = 0; r < I; ++r) {
      for (size_t c = 0; c < H; ++c) {
        ASSERT_EQ(moekit::bf16_to_float(v.w13[r * H + c]), value(ex * 2 * I + 2 * r, c));
        ASSERT_EQ(moekit::bf16_to_float(v.w13[(I + r) * H + c]), value(ex * 2 * I + 2 * r + 1, c));
      }
    }
    for (size_t hh = 0; hh < H; ++hh)
      for (size_t r = 0; r < I; ++r)
        ASSERT_EQ(moekit::bf16_to_float(v.w2[hh * I + r]), value(ex * H + hh, r));
    EXPECT_EQ(v.b13[0], 0.25f);
    EXPECT_EQ(v.b2[H - 1], -0.5f);
  }
}

// DeepSeek-V4 publishes routed experts as packed FP4 (I8 [N, K/2], low nibble = even column) with
// e8m0 scales <name>.scale [N, K/32]; they decode to fp4 * 2^(scale - 127).
TEST(Checkpoint, DeepSeekV4Fp4ExpertsDecode) {
  const MoeSpec spec = small_spec("deepseek-v4-flash");
  const int L = test_layer(spec);
  const size_t H = spec.hidden, I = spec.expert_intermediate;
  auto w = moekit::make_random_weights(spec, L, 12);
  const std::string dir = scratch_dir();
  const std::string file = moekit::save_checkpoint(*w, dir, CheckpointNaming::Auto);
  auto nib = [](size_t t, size_t r, size_t k) {
    return uint8_t((t * 5 + r * 3 + k * 11 + k / 7) % 16);
  };
  auto sc = [](size_t t, size_t r, size_t g) { return uint8_t(118 + (t + r + 5 * g) % 11); };
  auto value = [&](size_t t, size_t r, size_t k) {
    return kFp4[nib(t, r, k)] * std::ldexp(1.0f, int(sc(t, r, k / 32)) - 127);
  };
  const std::string base = "layers." + std::to_string(L) + ".ffn.experts.2.";
  const char* parts[3] = {"w1", "w3", "w2"};
  const size_t rows[3] = {I, I, H}, cols[3] = {H, H, I};
  std::map<std::string, moekit::SafetensorsWriteTensor> t;
  std::deque<std::vector<uint8_t>> store;
  {
    SafetensorsFile f(file);
    for (const auto& n : f.names()) {
      const uint8_t* d = static_cast<const uint8_t*>(f.data(n));
      store.emplace_back(d, d + f.info(n).nbytes());
      t[n] = {f.dtype(n), f.shape(n), {store.back().data(), store.back().size()}};
    }
  }
  for (size_t p = 0; p < 3; ++p) {
    std::vector<uint8_t>& q = store.emplace_back(rows[p] * cols[p] / 2);
    std::vector<uint8_t>& s = store.emplace_back(rows[p] * cols[p] / 32);
    for (size_t r = 0; r < rows[p]; ++r) {
      for (size_t k = 0; k < cols[p]; k += 2)
        q[(r * cols[p] + k) / 2] = uint8_t(nib(p, r, k) | nib(p, r, k + 1) << 4);
      for (size_t g = 0; g < cols[p] / 32; ++g) s[r * (cols[p] / 32) + g] = sc(p, r, g);
    }
    // Written as F8_E4M3 (one byte each), then the header says I8 / F8_E8M0.
    t[base + parts[p] + ".weight"] = {
        DType::F8_E4M3, {int64_t(rows[p]), int64_t(cols[p] / 2)}, {q.data(), q.size()}};
    t[base + parts[p] + ".scale"] = {
        DType::F8_E4M3, {int64_t(rows[p]), int64_t(cols[p] / 32)}, {s.data(), s.size()}};
  }
  moekit::write_safetensors(file, t);
  for (const char* part : parts) {
    moekit::test::replace_tensor_dtype(file, base + part + ".weight", "\"F8_E4M3\"", "\"I8\"     ");
    moekit::test::replace_tensor_dtype(file, base + part + ".scale", "\"F8_E4M3\"", "\"F8_E8M0\"");
  }
  fs::remove(dir + "/model.safetensors.index.json");  // the index lacks the new .scale tensors
  auto l = moekit::load_checkpoint_weights(spec, L, dir);
  const auto v = l->expert(2);
  for (size_t r = 0; r < I; ++r) {
    for (size_t c = 0; c < H; ++c) {
      ASSERT_EQ(moekit::bf16_to_float(v.w13[r * H + c]), value(0, r, c)) << r << "," << c;
      ASSERT_EQ(moekit::bf16_to_float(v.w13[(I + r) * H + c]), value(1, r, c)) << r << "," << c;
    }
  }
  for (size_t r = 0; r < H; ++r)
    for (size_t c = 0; c < I; ++c)
      ASSERT_EQ(moekit::bf16_to_float(v.w2[r * I + c]), value(2, r, c));
  // The other experts are untouched bf16.
  EXPECT_EQ(std::memcmp(l->expert(1).w13, w->expert(1).w13, 2 * I * H * 2), 0);
}

// The fast fp8 encoder of the checkpoint writer agrees with the exhaustive reference
// (moekit::float_to_fp8_e4m3) on every value that matters: all codes, midpoints, out of range.
TEST(Fp8Encode, MatchesExhaustiveSearch) {
  std::vector<float> values = {0.0f, 1e-9f, -1e-9f, 448.0f,       449.0f,
                               1e6f, -1e6f, 464.0f, 0.0009765625f};
  for (int c = 0; c < 256; ++c) {
    const float v = moekit::fp8_e4m3_to_float(uint8_t(c));
    if (std::isnan(v)) continue;
    values.push_back(v);
    const float next = moekit::fp8_e4m3_to_float(uint8_t(c + 1));
    if (c != 127 && c != 255 && !std::isnan(next)) {
      values.push_back(0.5f * (v + next));  // tie: round to even code
      values.push_back(std::nextafter(0.5f * (v + next), v));
    }
  }
  for (float f : values) {
    const uint8_t q = moekit::io::fp8_e4m3_encode(f);
    const uint8_t want = moekit::float_to_fp8_e4m3(f);
    // The reference breaks the +0 / -0 tie towards the even code 0x80; both decode to zero.
    if (moekit::fp8_e4m3_to_float(want) == 0.0f) {
      EXPECT_EQ(moekit::fp8_e4m3_to_float(q), 0.0f) << "f = " << f;
      continue;
    }
    EXPECT_EQ(q, want) << "f = " << f;
  }
  EXPECT_EQ(moekit::io::fp8_e4m3_encode(-0.0f), 0x80);
  EXPECT_EQ(moekit::io::fp8_e4m3_encode(NAN), 0x7f);
}

}  // namespace
