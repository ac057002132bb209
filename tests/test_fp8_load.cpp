// Loading an fp8 block-scale checkpoint with the experts kept in fp8 (LoadOptions::expert_format
// Fp8Block): the e4m3 bytes and the tile scales are the stored ones, laid out as ExpertView says
// (gate tiles, then up tiles), their dequantisation equals the bf16 load bit for bit; fused
// shared slots take their tiles; malformed scales and non-fp8 tensors are errors naming them.
// Checkpoints are DeepSeek-V3-like (per-expert and stacked HF names) and MiniMax-M2-like
// (block_sparse_moe.experts.{e}.w1/w3/w2), with H and I not multiples of 128 (edge tiles).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "expect_error.h"
#include "fp8_test_util.h"
#include "io_test_util.h"
#include "moekit/checkpoint.h"
#include "moekit/weights.h"
#include "shrunk_spec.h"

namespace moekit {
namespace {

using test::expect_error;

LoadOptions keep_fp8() {
  LoadOptions o;
  o.expert_format = ExpertFormat::Fp8Block;
  return o;
}

size_t tiles(size_t n) { return (n + 127) / 128; }

struct Case {
  const char* model;
  int hidden, inter, experts, layer;
  const char* gate;  // per-expert gate / up / down names inside the layer, {e} = expert
  const char* up;
  const char* down;
};

const Case kDeepSeek = {"deepseek-v3",
                        200,
                        96,
                        16,
                        3,
                        "mlp.experts.{e}.gate_proj.weight",
                        "mlp.experts.{e}.up_proj.weight",
                        "mlp.experts.{e}.down_proj.weight"};
const Case kMiniMax = {"minimax-m2",
                       160,
                       96,
                       12,
                       0,
                       "block_sparse_moe.experts.{e}.w1.weight",
                       "block_sparse_moe.experts.{e}.w3.weight",
                       "block_sparse_moe.experts.{e}.w2.weight"};

std::string name(const Case& c, const char* rel, int e) {
  std::string s = "model.layers." + std::to_string(c.layer) + "." + rel;
  const size_t at = s.find("{e}");
  if (at != std::string::npos) s.replace(at, 3, std::to_string(e));
  return s;
}

class Fp8Load : public ::testing::TestWithParam<Case> {};

// Per-expert names: w13 holds gate then up bytes, w13_scale the gate's tiles then the up's, and
// w2 the down bytes and tiles, all as stored; bf16 views are null.
TEST_P(Fp8Load, KeepsTheStoredBytesAndScales) {
  const Case c = GetParam();
  const MoeSpec spec = test::shrunk_spec(c.model, c.hidden, c.inter, c.experts);
  const std::string dir = test::scratch_dir();
  test::write_fp8_checkpoint(spec, c.layer, 7, false, dir);
  const auto w = load_checkpoint_weights(spec, c.layer, dir, keep_fp8());
  EXPECT_EQ(w->expert_dtype(), DType::F8_E4M3);
  EXPECT_NE(w->origin().find("kept in fp8"), std::string::npos) << w->origin();
  const size_t H = c.hidden, I = c.inter;
  for (int e : {0, 5, c.experts - 1}) {
    SCOPED_TRACE(e);
    const ExpertView v = w->expert(e);
    EXPECT_EQ(v.w13, nullptr);
    EXPECT_EQ(v.w2, nullptr);
    ASSERT_NE(v.w13_fp8, nullptr);
    const std::vector<uint8_t> g = test::tensor_bytes(dir, name(c, c.gate, e));
    const std::vector<uint8_t> u = test::tensor_bytes(dir, name(c, c.up, e));
    const std::vector<uint8_t> d = test::tensor_bytes(dir, name(c, c.down, e));
    ASSERT_EQ(g.size(), I * H);
    EXPECT_EQ(std::vector<uint8_t>(v.w13_fp8, v.w13_fp8 + I * H), g);
    EXPECT_EQ(std::vector<uint8_t>(v.w13_fp8 + I * H, v.w13_fp8 + 2 * I * H), u);
    EXPECT_EQ(std::vector<uint8_t>(v.w2_fp8, v.w2_fp8 + H * I), d);
    const auto gs = test::tensor_f32(dir, name(c, c.gate, e) + "_scale_inv");
    const auto us = test::tensor_f32(dir, name(c, c.up, e) + "_scale_inv");
    const auto ds = test::tensor_f32(dir, name(c, c.down, e) + "_scale_inv");
    ASSERT_EQ(gs.size(), tiles(I) * tiles(H));
    EXPECT_EQ(std::vector<float>(v.w13_scale, v.w13_scale + gs.size()), gs);
    EXPECT_EQ(std::vector<float>(v.w13_scale + gs.size(), v.w13_scale + 2 * gs.size()), us);
    EXPECT_EQ(std::vector<float>(v.w2_scale, v.w2_scale + ds.size()), ds);
  }
  EXPECT_EQ(w->materialised_experts(), 3);
}

// Dequantising the kept form (written out in the test) gives the bf16 load's weights bit for bit,
// for every routed expert and the shared MLP.
TEST_P(Fp8Load, DequantisedEqualsTheBf16Load) {
  const Case c = GetParam();
  const MoeSpec spec = test::shrunk_spec(c.model, c.hidden, c.inter, c.experts);
  const std::string dir = test::scratch_dir();
  test::write_fp8_checkpoint(spec, c.layer, 8, false, dir);
  const auto f8 = load_checkpoint_weights(spec, c.layer, dir, keep_fp8());
  const auto b16 = load_checkpoint_weights(spec, c.layer, dir);
  EXPECT_EQ(b16->expert_dtype(), DType::BF16);
  const size_t H = c.hidden, I = c.inter, gtiles = tiles(I) * tiles(H);
  for (int e = 0; e < c.experts; ++e) {
    const ExpertView q = f8->expert(e), b = b16->expert(e);
    const auto gate = test::dequantise(q.w13_fp8, q.w13_scale, I, H);
    const auto up = test::dequantise(q.w13_fp8 + I * H, q.w13_scale + gtiles, I, H);
    const auto down = test::dequantise(q.w2_fp8, q.w2_scale, H, I);
    EXPECT_TRUE(test::same_bits(gate.data(), b.w13, I * H)) << "expert " << e;
    EXPECT_TRUE(test::same_bits(up.data(), b.w13 + I * H, I * H)) << "expert " << e;
    EXPECT_TRUE(test::same_bits(down.data(), b.w2, H * I)) << "expert " << e;
  }
  if (spec.shared_kind != SharedKind::None) {
    const size_t Is = spec.shared_intermediate;
    EXPECT_EQ(f8->shared_w13(), nullptr);
    const auto gate = test::dequantise(f8->shared_w13_fp8(), f8->shared_w13_scale(), Is, H);
    const auto up = test::dequantise(f8->shared_w13_fp8() + Is * H,
                                     f8->shared_w13_scale() + tiles(Is) * tiles(H), Is, H);
    const auto down = test::dequantise(f8->shared_w2_fp8(), f8->shared_w2_scale(), H, Is);
    EXPECT_TRUE(test::same_bits(gate.data(), b16->shared_w13(), Is * H));
    EXPECT_TRUE(test::same_bits(up.data(), b16->shared_w13() + Is * H, Is * H));
    EXPECT_TRUE(test::same_bits(down.data(), b16->shared_w2(), H * Is));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Fp8Load, ::testing::Values(kDeepSeek, kMiniMax),
                         [](const auto& info) {
                           return std::string(info.param.model == std::string("deepseek-v3")
                                                  ? "DeepSeekV3"
                                                  : "MiniMaxM2");
                         });

// Stacked gate_up_proj [E, 2I, H] with I % 128 == 0: the bytes are used in place and the
// [2I/128, H/128] scale grid is the gate's tiles followed by the up's.
TEST(Fp8LoadStacked, UsesTheMappingAndSplitsNothing) {
  const MoeSpec spec = test::shrunk_spec("deepseek-v3", 200, 128, 16);
  const std::string dir = test::scratch_dir();
  test::write_fp8_checkpoint(spec, 3, 9, true, dir);
  const auto f8 = load_checkpoint_weights(spec, 3, dir, keep_fp8());
  const auto b16 = load_checkpoint_weights(spec, 3, dir);
  const size_t H = 200, I = 128;
  const auto gu = test::tensor_bytes(dir, "model.layers.3.mlp.experts.gate_up_proj");
  const auto gus = test::tensor_f32(dir, "model.layers.3.mlp.experts.gate_up_proj_scale_inv");
  ASSERT_EQ(gus.size(), 16 * tiles(2 * I) * tiles(H));
  for (int e : {0, 11}) {
    const ExpertView q = f8->expert(e), b = b16->expert(e);
    EXPECT_EQ(std::vector<uint8_t>(q.w13_fp8, q.w13_fp8 + 2 * I * H),
              std::vector<uint8_t>(gu.begin() + e * 2 * I * H, gu.begin() + (e + 1) * 2 * I * H));
    const size_t n = tiles(2 * I) * tiles(H);
    EXPECT_EQ(std::vector<float>(q.w13_scale, q.w13_scale + n),
              std::vector<float>(gus.begin() + e * n, gus.begin() + (e + 1) * n));
    const auto w13 = test::dequantise(q.w13_fp8, q.w13_scale, 2 * I, H);
    EXPECT_TRUE(test::same_bits(w13.data(), b.w13, 2 * I * H));
    const auto w2 = test::dequantise(q.w2_fp8, q.w2_scale, H, I);
    EXPECT_TRUE(test::same_bits(w2.data(), b.w2, H * I));
  }
}

TEST(Fp8LoadStacked, IntermediateOffTheTileIsAnErrorNamingI) {
  const MoeSpec spec = test::shrunk_spec("deepseek-v3", 200, 96, 16);
  const std::string dir = test::scratch_dir();
  test::write_fp8_checkpoint(spec, 3, 9, true, dir);
  expect_error([&] { load_checkpoint_weights(spec, 3, dir, keep_fp8()); },
               {"stacked fp8 gate_up_proj with I = 96", "not a multiple of 128"});
  EXPECT_NO_THROW(load_checkpoint_weights(spec, 3, dir));  // the bf16 load dequantises it
}

// Fused shared slot j takes rows/columns [jI, (j+1)I) of the shared MLP and their tiles; its
// dequantisation equals the bf16 load's slot. DeepSeek-V2-Lite shape: two shared slots.
TEST(Fp8LoadShared, FusedSlotsTakeTheirTiles) {
  const MoeSpec spec = test::shrunk_spec("deepseek-v2-lite", 200, 128, 16);
  ASSERT_EQ(spec.shared_slots(), 2);
  const std::string dir = test::scratch_dir();
  test::write_fp8_checkpoint(spec, 1, 10, false, dir);
  const auto f8 = load_checkpoint_weights(spec, 1, dir, keep_fp8());
  const auto b16 = load_checkpoint_weights(spec, 1, dir);
  const size_t H = 200, I = 128;
  for (int j = 0; j < 2; ++j) {
    SCOPED_TRACE(j);
    const ExpertView q = f8->expert(16 + j), b = b16->expert(16 + j);
    const auto w13 = test::dequantise(q.w13_fp8, q.w13_scale, 2 * I, H);
    EXPECT_TRUE(test::same_bits(w13.data(), b.w13, 2 * I * H));
    const auto w2 = test::dequantise(q.w2_fp8, q.w2_scale, H, I);
    EXPECT_TRUE(test::same_bits(w2.data(), b.w2, H * I));
  }
}

TEST(Fp8LoadShared, SlotBoundaryOffTheTileIsAnError) {
  const MoeSpec spec = test::shrunk_spec("deepseek-v2-lite", 200, 96, 16);
  ASSERT_EQ(spec.shared_slots(), 2);
  const std::string dir = test::scratch_dir();
  test::write_fp8_checkpoint(spec, 1, 10, false, dir);
  const auto f8 = load_checkpoint_weights(spec, 1, dir, keep_fp8());
  expect_error([&] { f8->expert(17); }, {"fp8 shared-expert fusion", "slot 1 starts at column 96",
                                         "I = 96", "run the shared expert unfused"});
  EXPECT_NO_THROW(f8->shared_w13_fp8());
}

// ---- malformed scales and tensors

class Fp8LoadBad : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = test::shrunk_spec("deepseek-v3", 200, 96, 16);
    dir_ = test::scratch_dir();
    test::write_fp8_checkpoint(spec_, 3, 11, false, dir_);
  }
  std::unique_ptr<LayerWeights> load() {
    return load_checkpoint_weights(spec_, 3, dir_, keep_fp8());
  }
  // Expert 4's up_proj and its scale.
  const std::string victim_ = "model.layers.3.mlp.experts.4.up_proj.weight";
  const std::string scale_ = victim_ + "_scale_inv";
  MoeSpec spec_;
  std::string dir_;
};

TEST_F(Fp8LoadBad, MissingScale) {
  test::edit_tensor(dir_, scale_, [](test::TensorEdit& t) { t.keep = false; });
  const std::string index = dir_ + "/model.safetensors.index.json";
  nlohmann::json j = nlohmann::json::parse(test::read_file(index));
  j["weight_map"].erase(scale_);
  test::write_file(index, j.dump());
  expect_error([&] { load(); }, {victim_, "is F8_E4M3 but has no block scale", scale_});
}

TEST_F(Fp8LoadBad, ScaleOfTheWrongShape) {
  test::edit_tensor(dir_, scale_, [](test::TensorEdit& t) { t.shape = {2, 1}; });
  expect_error([&] { load(); }, {scale_, "expected shape [1, 2] (128x128 blocks), got [2, 1]"});
}

TEST_F(Fp8LoadBad, ScaleOfTheWrongDtype) {
  test::replace_tensor_dtype(test::file_of(dir_, scale_), scale_, "\"F32\"", "\"I32\"");
  expect_error([&] { load(); }, {scale_, "expected dtype F32, BF16, F16 or F8_E8M0, got I32"});
}

TEST_F(Fp8LoadBad, NonFiniteNegativeOrZeroScales) {
  const struct {
    float value;
    const char* fragment;
  } bad[] = {{std::numeric_limits<float>::quiet_NaN(), "nan"},
             {std::numeric_limits<float>::infinity(), "inf"},
             {-0.5f, "-0.5"},
             {0.0f, "is 0, expected a finite scale > 0"}};
  for (const auto& b : bad) {
    SCOPED_TRACE(b.fragment);
    SetUp();
    test::set_f32(dir_, scale_, 1, b.value);
    const auto w = load();  // headers only: the scale is read with its expert
    expect_error([&] { w->expert(4); }, {scale_, b.fragment});
    EXPECT_NO_THROW(w->expert(3));
  }
}

// scale_fmt ue8m0: the writer's amax/448 scales are not powers of two, so the first one read
// (the shared MLP's, at load) is an error; with every scale a power of two the load succeeds.
TEST_F(Fp8LoadBad, Ue8m0ScaleThatIsNotAPowerOfTwo) {
  spec_.quant.scale_ue8m0 = true;
  expect_error([&] { load()->expert(0); },
               {"_scale_inv", "tile (0, 0)", "scale_fmt is ue8m0", "power of two"});
  for (const std::string& s :
       {"experts.0.gate_proj", "experts.0.up_proj", "experts.0.down_proj",
        "shared_experts.gate_proj", "shared_experts.up_proj", "shared_experts.down_proj"}) {
    const std::string name = "model.layers.3.mlp." + s + ".weight_scale_inv";
    test::edit_tensor(dir_, name, [](test::TensorEdit& t) {
      for (size_t i = 0; i < t.bytes.size() / 4; ++i) {
        const float v = std::ldexp(1.0f, -8 - static_cast<int>(i));
        std::memcpy(t.bytes.data() + 4 * i, &v, 4);
      }
    });
  }
  EXPECT_NO_THROW(load()->expert(0));
}

TEST_F(Fp8LoadBad, NanCodeInTheWeights) {
  test::edit_tensor(dir_, victim_, [](test::TensorEdit& t) { t.bytes[200 + 7] = 0xff; });
  expect_error([&] { load()->expert(4); },
               {"expert 4 gate/up weight", "e4m3 NaN code (0xff)", "row 97, column 7"});
}

TEST_F(Fp8LoadBad, Bf16ExpertsCannotBeKeptInFp8) {
  const std::string dir = test::scratch_dir("_bf16");
  save_checkpoint(*make_random_weights(spec_, 3, 1), dir, SaveCheckpointOptions{});
  expect_error([&] { load_checkpoint_weights(spec_, 3, dir, keep_fp8()); },
               {"model.layers.3.mlp.experts.0.gate_proj.weight",
                "expected dtype F8_E4M3 with a 128x128 block scale", "got BF16"});
  expect_error([&] { parse_expert_format("f16"); },
               {"unknown expert format 'f16'", "bf16, fp8, mxfp4 or mxfp8"});
}

TEST_F(Fp8LoadBad, SavingFp8HeldWeightsIsAnError) {
  expect_error(
      [&] { save_checkpoint(*load(), test::scratch_dir("_out"), SaveCheckpointOptions{}); },
      {"held in fp8", "load them with expert format bf16"});
}

}  // namespace
}  // namespace moekit
