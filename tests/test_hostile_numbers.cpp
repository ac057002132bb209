// Non-finite numbers (issue 35): NaN and infinity in checkpoint weights, biases and fp8 block
// scales are refused when read (naming the tensor or the expert); a scale that overflows bf16 once
// applied is caught after dequantisation; `moekit run` exits non-zero when its output is not
// finite instead of printing NaN with exit 0.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "expect_error.h"
#include "hostile_util.h"
#include "moekit/checkpoint.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

using test::expect_error;
using test::scratch_dir;

const std::string kNanBf16("\xc0\x7f", 2);  // 0x7FC0 little-endian
const std::string kInfBf16("\x80\x7f", 2);  // 0x7F80
const std::string kHugeBf16("\x7f\x7f", 2);  // 0x7F7F, about 3.39e38: finite

std::string f32_bytes(float v) {
  std::string b(4, '\0');
  std::memcpy(b.data(), &v, 4);
  return b;
}

class HostileNumbers : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = test::small_spec("deepseek-v3");  // H 64, E 16, I 32, shared expert, correction bias
    layer_ = spec_.moe_layers.front();
    dir_ = scratch_dir();
  }
  std::string save(DType expert_dtype = DType::BF16) {
    SaveCheckpointOptions opt;
    opt.expert_dtype = expert_dtype;
    return save_checkpoint(*make_random_weights(spec_, layer_, 9), dir_, opt);
  }
  std::string name(const std::string& rel) const {
    return "model.layers." + std::to_string(layer_) + ".mlp." + rel;
  }
  std::unique_ptr<LayerWeights> load() { return load_checkpoint_weights(spec_, layer_, dir_); }

  MoeSpec spec_;
  int layer_ = 0;
  std::string dir_;
};

TEST_F(HostileNumbers, NanInExpertWeightWhenMaterialised) {
  const std::string file = save();
  // Row 1, column 3 of expert 5's up_proj: row I + 1 of the expert's w13.
  test::poke_tensor(file, name("experts.5.up_proj.weight"), (1 * 64 + 3) * 2, kNanBf16);
  const auto w = load();
  EXPECT_NO_THROW(w->expert(4));
  expect_error([&] { w->expert(5); },
               {"layer " + std::to_string(layer_) + ": expert 5 gate/up weight [2I, H]",
                "non-finite value (nan) at row 33, column 3"});
}

TEST_F(HostileNumbers, InfInSharedWeightAtLoad) {
  const std::string file = save();
  test::poke_tensor(file, name("shared_experts.down_proj.weight"), 10, kInfBf16);
  expect_error([&] { load(); }, {"shared down weight [H, Is]", "non-finite value (inf)"});
}

TEST_F(HostileNumbers, NanRouterWeightAtLoad) {
  const std::string file = save();
  test::poke_tensor(file, name("gate.weight"), 0, kNanBf16);
  expect_error([&] { load(); }, {"gate.weight", "(router weight)", "non-finite value (nan)"});
}

TEST_F(HostileNumbers, NanCorrectionBiasIsAnError) {
  // A NaN bias compares as the largest key: expert 0 would join every token's top-k silently.
  const std::string file = save();
  test::poke_tensor(file, name("gate.e_score_correction_bias"), 0, f32_bytes(NAN));
  expect_error([&] { load(); }, {"(e_score_correction_bias)", "non-finite value (nan)"});
}

TEST_F(HostileNumbers, Fp8ScalesNanNegativeAndOverflowing) {
  const std::string file = save(DType::F8_E4M3);
  const std::string scale = name("experts.2.gate_proj.weight_scale_inv");
  test::poke_tensor(file, scale, 0, f32_bytes(NAN));
  expect_error([&] { load()->expert(2); }, {scale, "element 0 is nan, expected a finite scale >= 0"});
  test::poke_tensor(file, scale, 0, f32_bytes(-1.0f));
  expect_error([&] { load()->expert(2); }, {"element 0 is -1, expected a finite scale >= 0"});
  // Finite, but 448 x 1e38 overflows bf16: caught once dequantised.
  test::poke_tensor(file, scale, 0, f32_bytes(1e38f));
  expect_error([&] { load()->expert(2); }, {"expert 2 gate/up weight", "holds a non-finite value (", "inf)"});
}

TEST_F(HostileNumbers, RunExitsNonZeroOnNonFiniteOutput) {
  if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built";
  const std::string file = save();
  // Finite weights so large that the shared MLP's output overflows fp32.
  for (const char* t : {"shared_experts.gate_proj.weight", "shared_experts.up_proj.weight",
                        "shared_experts.down_proj.weight"}) {
    std::string huge;
    for (int i = 0; i < 32 * 64; ++i) huge += kHugeBf16;
    test::poke_tensor(file, name(t), 0, huge);
  }
  const std::string config = test::write_tiny_config(dir_);
  const test::CliRun r = test::run_moekit(
      dir_, "run --model " + config + " --weights " + dir_ + " --device cpu --fuse-shared off");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("the output of the forward (shared expert unfused) is not finite"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace moekit
