// Loading OCP MX checkpoints with the experts kept packed (LoadOptions::expert_format Mxfp4 /
// Mxfp8): gpt-oss's published MXFP4 names and MiniMax-M3-style MXFP8 names as the project's
// writer produces them, the bytes and e8m0 scale bytes of every matrix where ExpertView says
// (gpt-oss's interleaved gate/up rows de-interleaved), their dequantisation by the OCP tables
// equal to the bf16 load bit for bit, the scale spellings accepted, and every malformed input
// refused with a message naming the tensor and what was found.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "expect_error.h"
#include "io_test_util.h"
#include "moekit/checkpoint.h"
#include "moekit/weights.h"
#include "mx_test_util.h"

namespace moekit {
namespace {

using test::expect_error;

LoadOptions keep(ExpertFormat f) {
  LoadOptions o;
  o.expert_format = f;
  return o;
}

bool same_bytes(const uint8_t* a, const uint8_t* b, size_t n) { return std::memcmp(a, b, n) == 0; }

// gpt-oss shrunk: H 96, I 64, E 8 (every layer MoE; layer 0).
MoeSpec gpt_oss(int hidden = 96) { return test::mx_spec("gpt-oss-120b", hidden, 64, 8, 0); }
// MiniMax-M3 shrunk, MXFP8: H 96, I 64, E 8, two shared slots; layers 0-2 are dense.
MoeSpec minimax(int hidden = 96) {
  return test::mx_spec("minimax-m3", hidden, 64, 8, 2, test::mxfp8_quant());
}
constexpr int kMiniMaxLayer = 3;

TEST(MxLoad, GptOssMxfp4IsWrittenInThePublishedNamesAndKeptAsStored) {
  const MoeSpec spec = gpt_oss();
  ASSERT_EQ(spec.quant.kind, QuantKind::Mxfp4);
  const size_t E = 8, H = 96, I = 64;
  const std::string dir = test::scratch_dir();
  test::write_mx_checkpoint(spec, 0, 7, ExpertFormat::Mxfp4, false, dir);
  const std::string p = "model.layers.0.mlp.experts.";
  const test::RawTensor gb = test::raw_tensor(dir, p + "gate_up_proj_blocks");
  const test::RawTensor gs = test::raw_tensor(dir, p + "gate_up_proj_scales");
  const test::RawTensor db = test::raw_tensor(dir, p + "down_proj_blocks");
  const test::RawTensor ds = test::raw_tensor(dir, p + "down_proj_scales");
  EXPECT_EQ(gb.dtype, "U8");
  EXPECT_EQ(gs.dtype, "U8");
  EXPECT_EQ(gb.shape, (std::vector<int64_t>{8, 128, 3, 16}));
  EXPECT_EQ(gs.shape, (std::vector<int64_t>{8, 128, 3}));
  EXPECT_EQ(db.shape, (std::vector<int64_t>{8, 96, 2, 16}));
  EXPECT_EQ(ds.shape, (std::vector<int64_t>{8, 96, 2}));
  EXPECT_EQ(test::raw_tensor(dir, p + "gate_up_proj_bias").shape, (std::vector<int64_t>{8, 128}));

  const auto w = load_checkpoint_weights(spec, 0, dir, keep(ExpertFormat::Mxfp4));
  EXPECT_EQ(w->expert_format(), ExpertFormat::Mxfp4);
  EXPECT_NE(w->origin().find("kept in mxfp4"), std::string::npos) << w->origin();
  const size_t row = H / 2, g = H / 32;
  for (size_t e = 0; e < E; ++e) {
    SCOPED_TRACE("expert " + std::to_string(e));
    const ExpertView v = w->expert(static_cast<int>(e));
    EXPECT_EQ(v.mx_format, ExpertFormat::Mxfp4);
    EXPECT_EQ(v.w13, nullptr);
    EXPECT_EQ(v.w2, nullptr);
    ASSERT_NE(v.b13, nullptr);
    for (size_t i = 0; i < I; ++i) {
      // checkpoint row 2i is gate row i, 2i+1 up row i
      const size_t gate = e * 2 * I + 2 * i, up = gate + 1;
      ASSERT_TRUE(same_bytes(v.w13_mx + i * row, gb.bytes.data() + gate * row, row)) << i;
      ASSERT_TRUE(same_bytes(v.w13_mx + (I + i) * row, gb.bytes.data() + up * row, row)) << i;
      ASSERT_TRUE(same_bytes(v.w13_mx_scale + i * g, gs.bytes.data() + gate * g, g)) << i;
      ASSERT_TRUE(same_bytes(v.w13_mx_scale + (I + i) * g, gs.bytes.data() + up * g, g)) << i;
    }
    EXPECT_TRUE(same_bytes(v.w2_mx, db.bytes.data() + e * H * I / 2, H * I / 2));
    EXPECT_TRUE(same_bytes(v.w2_mx_scale, ds.bytes.data() + e * H * I / 32, H * I / 32));
  }
}

TEST(MxLoad, Mxfp4DequantisesToTheBf16LoadAndNearTheSourceWeights) {
  const MoeSpec spec = gpt_oss();
  const size_t H = 96, I = 64;
  const std::string dir = test::scratch_dir();
  test::write_mx_checkpoint(spec, 0, 8, ExpertFormat::Mxfp4, false, dir);
  const auto mx = load_checkpoint_weights(spec, 0, dir, keep(ExpertFormat::Mxfp4));
  const auto b16 = load_checkpoint_weights(spec, 0, dir);
  const auto src = make_random_weights(spec, 0, 8);
  for (int e = 0; e < 8; ++e) {
    const ExpertView v = mx->expert(e), b = b16->expert(e), s = src->expert(e);
    const auto w13 = test::mx_dequantise(ExpertFormat::Mxfp4, v.w13_mx, v.w13_mx_scale, 2 * I, H);
    const auto w2 = test::mx_dequantise(ExpertFormat::Mxfp4, v.w2_mx, v.w2_mx_scale, H, I);
    EXPECT_TRUE(test::same_bits(w13.data(), b.w13, w13.size())) << e;
    EXPECT_TRUE(test::same_bits(w2.data(), b.w2, w2.size())) << e;
    EXPECT_EQ(std::vector<float>(v.b13, v.b13 + 2 * I), std::vector<float>(b.b13, b.b13 + 2 * I));
    // The writer's quantiser: e2m1 steps are at most 2 units of 2^e <= amax / 4 per block.
    for (size_t r = 0; r < 2 * I; ++r) {
      for (size_t blk = 0; blk < H / 32; ++blk) {
        float amax = 0;
        for (size_t c = blk * 32; c < blk * 32 + 32; ++c)
          amax = std::max(amax, std::fabs(bf16_to_float(s.w13[r * H + c])));
        for (size_t c = blk * 32; c < blk * 32 + 32; ++c)
          ASSERT_LE(std::fabs(bf16_to_float(w13[r * H + c]) - bf16_to_float(s.w13[r * H + c])),
                    amax / 4 * 1.0001f)
              << "row " << r << ", column " << c;
      }
    }
  }
}

class MxLoadMiniMax : public ::testing::TestWithParam<bool> {};  // stacked or per-expert

TEST_P(MxLoadMiniMax, Mxfp8KeepsTheBytesAndDequantisesToTheBf16Load) {
  const bool stacked = GetParam();
  const MoeSpec spec = minimax();
  ASSERT_EQ(spec.quant.kind, QuantKind::Mxfp8);
  ASSERT_EQ(spec.shared_slots(), 2);
  const size_t H = 96, I = 64, Is = 128;
  const std::string dir = test::scratch_dir(stacked ? "_stacked" : "");
  test::write_mx_checkpoint(spec, kMiniMaxLayer, 9, ExpertFormat::Mxfp8, stacked, dir);
  const std::string p = "language_model.model.layers.3.block_sparse_moe.";
  if (!stacked) {
    const test::RawTensor w1 = test::raw_tensor(dir, p + "experts.0.w1.weight");
    const test::RawTensor s1 = test::raw_tensor(dir, p + "experts.0.w1.weight_scale");
    EXPECT_EQ(w1.dtype, "F8_E4M3");
    EXPECT_EQ(w1.shape, (std::vector<int64_t>{64, 96}));
    EXPECT_EQ(s1.dtype, "U8");
    EXPECT_EQ(s1.shape, (std::vector<int64_t>{64, 3}));
  } else {
    EXPECT_EQ(test::raw_tensor(dir, p + "experts.gate_up_proj_scale").shape,
              (std::vector<int64_t>{8, 128, 3}));
  }
  EXPECT_EQ(test::raw_tensor(dir, p + "shared_experts.down_proj.weight_scale").shape,
            (std::vector<int64_t>{96, 4}));

  const auto mx = load_checkpoint_weights(spec, kMiniMaxLayer, dir, keep(ExpertFormat::Mxfp8));
  const auto b16 = load_checkpoint_weights(spec, kMiniMaxLayer, dir);
  EXPECT_EQ(mx->expert_format(), ExpertFormat::Mxfp8);
  for (int e = 0; e < 8 + 2; ++e) {  // routed experts, then the two fused shared slots
    SCOPED_TRACE("expert " + std::to_string(e));
    const ExpertView v = mx->expert(e), b = b16->expert(e);
    ASSERT_NE(v.w13_mx, nullptr);
    EXPECT_EQ(v.mx_format, ExpertFormat::Mxfp8);
    EXPECT_TRUE(test::same_bits(
        test::mx_dequantise(ExpertFormat::Mxfp8, v.w13_mx, v.w13_mx_scale, 2 * I, H).data(), b.w13,
        2 * I * H));
    EXPECT_TRUE(test::same_bits(
        test::mx_dequantise(ExpertFormat::Mxfp8, v.w2_mx, v.w2_mx_scale, H, I).data(), b.w2,
        H * I));
  }
  if (!stacked) {
    const test::RawTensor w3 = test::raw_tensor(dir, p + "experts.5.w3.weight");
    const test::RawTensor s3 = test::raw_tensor(dir, p + "experts.5.w3.weight_scale");
    EXPECT_TRUE(same_bytes(mx->expert(5).w13_mx + I * H, w3.bytes.data(), I * H));
    EXPECT_TRUE(same_bytes(mx->expert(5).w13_mx_scale + I * H / 32, s3.bytes.data(), I * H / 32));
  }
  EXPECT_TRUE(test::same_bits(test::mx_dequantise(ExpertFormat::Mxfp8, mx->shared_w13_mx(),
                                                  mx->shared_w13_mx_scale(), 2 * Is, H)
                                  .data(),
                              b16->shared_w13(), 2 * Is * H));
  EXPECT_TRUE(test::same_bits(test::mx_dequantise(ExpertFormat::Mxfp8, mx->shared_w2_mx(),
                                                  mx->shared_w2_mx_scale(), H, Is)
                                  .data(),
                              b16->shared_w2(), H * Is));
}

INSTANTIATE_TEST_SUITE_P(Forms, MxLoadMiniMax, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Stacked" : "PerExpert"; });

TEST(MxLoad, Mxfp8ScaleSpellings) {
  const MoeSpec spec = minimax();
  const std::string dir = test::scratch_dir();
  test::write_mx_checkpoint(spec, kMiniMaxLayer, 10, ExpertFormat::Mxfp8, false, dir);
  const std::string w1 = "language_model.model.layers.3.block_sparse_moe.experts.2.w1.weight";
  const std::vector<uint8_t> before = test::raw_tensor(dir, w1 + "_scale").bytes;
  // "<name>_scale_inv", the fp8 checkpoints' spelling
  test::edit_raw(dir, w1 + "_scale", [&](test::RawTensor& t) { t.rename = w1 + "_scale_inv"; });
  const auto w = load_checkpoint_weights(spec, kMiniMaxLayer, dir, keep(ExpertFormat::Mxfp8));
  EXPECT_TRUE(same_bytes(w->expert(2).w13_mx_scale, before.data(), before.size()));
  // an unknown spelling: the error lists every name tried
  test::edit_raw(dir, w1 + "_scale_inv", [&](test::RawTensor& t) { t.rename = w1 + "_scales"; });
  expect_error([&] { load_checkpoint_weights(spec, kMiniMaxLayer, dir, keep(ExpertFormat::Mxfp8)); },
               {w1, "has no e8m0 scale: tried", "'" + w1 + "_scale_inv'", "'" + w1 + "_scale'",
                "experts.2.w1.scale'"});
}

// ---- malformed inputs

TEST(MxLoadBad, Mxfp4ScaleOfTheWrongShapeOrDtype) {
  const MoeSpec spec = gpt_oss();
  const std::string dir = test::scratch_dir();
  test::write_mx_checkpoint(spec, 0, 11, ExpertFormat::Mxfp4, false, dir);
  const std::string s = "model.layers.0.mlp.experts.gate_up_proj_scales";
  test::edit_raw(dir, s, [](test::RawTensor& t) { t.shape = {8, 64, 6}; });
  expect_error([&] { load_checkpoint_weights(spec, 0, dir, keep(ExpertFormat::Mxfp4)); },
               {s, "expected shape [8, 128, 3]", "got [8, 64, 6]"});
  test::edit_raw(dir, s, [](test::RawTensor& t) {
    t.shape = {8, 128, 3};
    t.dtype = "F32";
    t.bytes.assign(8 * 128 * 3 * 4, 0);
  });
  expect_error([&] { load_checkpoint_weights(spec, 0, dir, keep(ExpertFormat::Mxfp4)); },
               {s, "expected dtype U8, got F32"});
}

TEST(MxLoadBad, Mxfp8ScaleOfTheWrongShapeOrDtype) {
  const MoeSpec spec = minimax();
  const std::string dir = test::scratch_dir();
  test::write_mx_checkpoint(spec, kMiniMaxLayer, 12, ExpertFormat::Mxfp8, false, dir);
  const std::string s =
      "language_model.model.layers.3.block_sparse_moe.experts.4.w2.weight_scale";
  test::edit_raw(dir, s, [](test::RawTensor& t) { t.shape = {48, 4}; });
  expect_error([&] { load_checkpoint_weights(spec, kMiniMaxLayer, dir, keep(ExpertFormat::Mxfp8)); },
               {s, "expected shape [96, 2] (one per 1x32 block), got [48, 4]"});
  for (const char* dtype : {"F32", "BF16"}) {
    test::edit_raw(dir, s, [&](test::RawTensor& t) {
      t.shape = {96, 2};
      t.dtype = dtype;
      t.bytes.assign(96 * 2 * (std::string(dtype) == "F32" ? 4 : 2), 0);
    });
    // a float scale is a plain number, which an e8m0 reader must never take
    expect_error(
        [&] { load_checkpoint_weights(spec, kMiniMaxLayer, dir, keep(ExpertFormat::Mxfp8)); },
        {s, "expected dtype U8 or F8_E8M0 (e8m0 exponent bytes), got " + std::string(dtype)});
    expect_error([&] { load_checkpoint_weights(spec, kMiniMaxLayer, dir); },
                 {s, "e8m0 exponent bytes"});
  }
}

TEST(MxLoadBad, AnE8m0ByteOf255IsNaN) {
  {
    const MoeSpec spec = gpt_oss();
    const std::string dir = test::scratch_dir("_fp4");
    test::write_mx_checkpoint(spec, 0, 13, ExpertFormat::Mxfp4, false, dir);
    // expert 1, checkpoint row 5 (= up row 2), block 1
    test::edit_raw(dir, "model.layers.0.mlp.experts.down_proj_scales",
                   [](test::RawTensor& t) { t.bytes[1 * 96 * 2 + 7 * 2 + 1] = 255; });
    const auto w = load_checkpoint_weights(spec, 0, dir, keep(ExpertFormat::Mxfp4));
    w->expert(0);
    expect_error([&] { w->expert(1); },
                 {"expert 1 down blocks", "row 7, columns [32, 64)", "is 255 (NaN)"});
  }
  {
    const MoeSpec spec = minimax();
    const std::string dir = test::scratch_dir("_fp8");
    test::write_mx_checkpoint(spec, kMiniMaxLayer, 14, ExpertFormat::Mxfp8, false, dir);
    test::edit_raw(dir, "language_model.model.layers.3.block_sparse_moe.experts.6.w3.weight_scale",
                   [](test::RawTensor& t) { t.bytes[10 * 3 + 2] = 255; });
    const auto w = load_checkpoint_weights(spec, kMiniMaxLayer, dir, keep(ExpertFormat::Mxfp8));
    // w3 row 10 is row I + 10 of the gate/up block
    expect_error([&] { w->expert(6); },
                 {"expert 6 gate/up weight", "row 74, columns [64, 96)", "is 255 (NaN)"});
  }
}

TEST(MxLoadBad, BlocksThatDoNotDivideTheRow) {
  {
    // an mxfp8 config over rows of 200 columns (an fp8 checkpoint's shapes)
    const MoeSpec spec = minimax(200);
    const std::string dir = test::scratch_dir("_fp8");
    test::write_fp8_checkpoint(spec, kMiniMaxLayer, 15, false, dir);
    expect_error([&] { load_checkpoint_weights(spec, kMiniMaxLayer, dir); },
                 {"experts.0.w1.weight", "rows of 200 columns are not a whole number of "
                                         "32-element mxfp8 blocks"});
  }
  {
    // gpt-oss with H = 100 whose gate_up is named as MXFP4 blocks
    const std::string dir = test::scratch_dir("_fp4");
    save_checkpoint(*make_random_weights(gpt_oss(100), 0, 16), dir, SaveCheckpointOptions{});
    test::edit_raw(dir, "model.layers.0.mlp.experts.gate_up_proj", [](test::RawTensor& t) {
      t.rename = "model.layers.0.mlp.experts.gate_up_proj_blocks";
    });
    expect_error([&] { load_checkpoint_weights(gpt_oss(100), 0, dir); },
                 {"MXFP4 experts need hidden and intermediate sizes divisible by 32",
                  "H = 100"});
  }
}

TEST(MxLoadBad, OtherScaleLayoutsAreNamed) {
  // a 128x128 fp8 block-scale checkpoint read with an mxfp8 config: the scale found is named
  const MoeSpec spec = minimax();
  const std::string dir = test::scratch_dir();
  test::write_fp8_checkpoint(spec, kMiniMaxLayer, 17, false, dir);
  expect_error([&] { load_checkpoint_weights(spec, kMiniMaxLayer, dir); },
               {"experts.0.w1.weight_scale_inv", "expected shape [64, 3] (one per 1x32 block)",
                "got [1, 1]"});
}

TEST(MxLoadBad, NaNCodesAndOverflowingBlocks) {
  {
    const MoeSpec spec = minimax();
    const std::string dir = test::scratch_dir("_nan");
    test::write_mx_checkpoint(spec, kMiniMaxLayer, 18, ExpertFormat::Mxfp8, false, dir);
    test::edit_raw(dir, "language_model.model.layers.3.block_sparse_moe.experts.1.w2.weight",
                   [](test::RawTensor& t) { t.bytes[3 * 64 + 40] = 0xff; });
    const auto w = load_checkpoint_weights(spec, kMiniMaxLayer, dir, keep(ExpertFormat::Mxfp8));
    expect_error([&] { w->expert(1); }, {"e4m3 NaN code (0xff) at row 3, column 40"});
  }
  {
    const MoeSpec spec = gpt_oss();
    const std::string dir = test::scratch_dir("_inf");
    test::write_mx_checkpoint(spec, 0, 19, ExpertFormat::Mxfp4, false, dir);
    // block 0 of gate_up row 0 of expert 0: a 6 (code 7) times 2^(254-127) overflows
    test::edit_raw(dir, "model.layers.0.mlp.experts.gate_up_proj_blocks",
                   [](test::RawTensor& t) { t.bytes[0] = 0x07; });
    test::edit_raw(dir, "model.layers.0.mlp.experts.gate_up_proj_scales",
                   [](test::RawTensor& t) { t.bytes[0] = 254; });
    const auto w = load_checkpoint_weights(spec, 0, dir, keep(ExpertFormat::Mxfp4));
    expect_error([&] { w->expert(0); }, {"row 0, columns [0, 32) overflow", "2^(254 - 127)"});
    // the bf16 load of the same bytes refuses it too (its dequantised weight is infinite)
    expect_error([&] { load_checkpoint_weights(spec, 0, dir)->expert(0); }, {"expert 0"});
  }
}

TEST(MxLoadBad, FormatsThatTheCheckpointDoesNotHold) {
  const MoeSpec spec = minimax();
  const std::string dir = test::scratch_dir();
  save_checkpoint(*make_random_weights(spec, kMiniMaxLayer, 1), dir, SaveCheckpointOptions{});
  expect_error([&] { load_checkpoint_weights(spec, kMiniMaxLayer, dir, keep(ExpertFormat::Mxfp8)); },
               {"experts.0.w1.weight", "expected dtype F8_E4M3 with a 1x32 e8m0 scale", "got BF16"});
  expect_error([&] { load_checkpoint_weights(spec, kMiniMaxLayer, dir, keep(ExpertFormat::Mxfp4)); },
               {"per-expert experts have no mxfp4 form"});
  const MoeSpec plain = test::mx_spec("minimax-m3", 96, 64, 8, 2);
  expect_error([&] { load_checkpoint_weights(plain, kMiniMaxLayer, dir, keep(ExpertFormat::Mxfp8)); },
               {"needs a config whose quantization_config.quant_method is mxfp8, got none"});
  // MX-held weights are not re-saved
  const std::string mxdir = test::scratch_dir("_mx");
  test::write_mx_checkpoint(spec, kMiniMaxLayer, 2, ExpertFormat::Mxfp8, false, mxdir);
  expect_error(
      [&] {
        save_checkpoint(*load_checkpoint_weights(spec, kMiniMaxLayer, mxdir,
                                                 keep(ExpertFormat::Mxfp8)),
                        test::scratch_dir("_out"), SaveCheckpointOptions{});
      },
      {"held in mxfp8", "load them with expert format bf16"});
  // the writer refuses forms that no checkpoint has
  SaveCheckpointOptions o;
  o.expert_format = ExpertFormat::Mxfp4;
  expect_error([&] { save_checkpoint(*make_random_weights(spec, kMiniMaxLayer, 1), mxdir, o); },
               {"mxfp4 is written in gpt-oss's _blocks / _scales form only"});
}

}  // namespace
}  // namespace moekit
