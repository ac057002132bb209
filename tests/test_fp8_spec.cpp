// quantization_config as transformers reads it: the published fp8 configs parse to Fp8Block with
// 128x128 tiles (DeepSeek-V4-Flash: ue8m0 scales), gpt-oss to mxfp4, the rest to none; what
// moekit cannot run is an error naming the key and the value; the fp8 byte counts.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "expect_error.h"
#include "moekit/spec.h"

namespace moekit {
namespace {

using test::expect_error;

nlohmann::json config_json(const std::string& model) {
  std::ifstream in(std::string(MOEKIT_TEST_DATA_DIR) + "/../configs/" + model + ".json");
  EXPECT_TRUE(in) << model;
  return nlohmann::json::parse(in);
}

MoeSpec with_quant(const nlohmann::json& quant) {
  nlohmann::json c = config_json("deepseek-v3");
  c["quantization_config"] = quant;
  return parse_spec_json(c.dump(), "dsv3-quant");
}

TEST(Fp8Spec, PublishedConfigsDeclareTheirQuantisation) {
  for (const char* model : {"deepseek-v3", "kimi-k2", "minimax-m2", "deepseek-v4-flash"}) {
    SCOPED_TRACE(model);
    const MoeSpec s = load_spec(model);
    EXPECT_EQ(s.quant.kind, QuantKind::Fp8Block);
    EXPECT_TRUE(s.fp8_experts());
    EXPECT_EQ(s.quant.block_out, 128);
    EXPECT_EQ(s.quant.block_in, 128);
    EXPECT_EQ(s.quant.activation_scheme, "dynamic");
    EXPECT_EQ(s.quant.scale_ue8m0, std::string(model) == "deepseek-v4-flash");
  }
  // MiniMax-M2 spells the format float8_e4m3fn and keeps its gate and bias unquantised.
  EXPECT_EQ(load_spec("minimax-m2").quant.modules_to_not_convert,
            (std::vector<std::string>{"gate", "e_score_correction_bias", "lm_head"}));
  EXPECT_EQ(load_spec("gpt-oss-120b").quant.kind, QuantKind::Mxfp4);
  for (const char* model : {"qwen3-30b-a3b", "mixtral-8x7b", "glm-4.5", "minimax-m3"}) {
    EXPECT_EQ(load_spec(model).quant.kind, QuantKind::None) << model;
    EXPECT_FALSE(load_spec(model).fp8_experts()) << model;
  }
}

TEST(Fp8Spec, OmittedKeysTakeTheTransformersDefaults) {
  const MoeSpec s = with_quant({{"quant_method", "fp8"}});
  EXPECT_EQ(s.quant.kind, QuantKind::Fp8Block);
  EXPECT_EQ(s.quant.block_out, 128);
  EXPECT_EQ(s.quant.block_in, 128);
  EXPECT_EQ(s.quant.activation_scheme, "dynamic");
  EXPECT_FALSE(s.quant.scale_ue8m0);
  EXPECT_EQ(with_quant({{"quant_method", "fp8"}, {"scale_fmt", nullptr}}).quant.scale_ue8m0, false);
}

TEST(Fp8Spec, UnsupportedValuesAreErrorsNamingKeyAndValue) {
  expect_error(
      [] {
        with_quant({{"quant_method", "fp8"}, {"fmt", "e5m2"}});
      },
      {"dsv3-quant", "quantization_config.fmt", "'e5m2'", "e4m3"});
  expect_error(
      [] {
        with_quant({{"quant_method", "fp8"}, {"weight_block_size", {64, 128}}});
      },
      {"quantization_config.weight_block_size", "[64, 128]", "expected [128, 128]"});
  expect_error(
      [] {
        with_quant({{"quant_method", "fp8"}, {"weight_block_size", {128}}});
      },
      {"quantization_config.weight_block_size", "two integers"});
  expect_error(
      [] {
        with_quant({{"quant_method", "fp8"}, {"weight_block_size", "128"}});
      },
      {"quantization_config.weight_block_size", "two integers", "\"128\""});
  expect_error(
      [] {
        with_quant({{"quant_method", "awq"}});
      },
      {"quantization_config.quant_method", "'awq'", "fp8, mxfp4 or mxfp8"});
  expect_error(
      [] {
        with_quant({{"quant_method", "fp8"}, {"activation_scheme", "static"}});
      },
      {"quantization_config.activation_scheme", "'static'", "dynamic"});
  expect_error(
      [] {
        with_quant({{"quant_method", "fp8"}, {"scale_fmt", "e8m0x"}});
      },
      {"quantization_config.scale_fmt", "'e8m0x'"});
  expect_error([] { with_quant({{"fmt", "e4m3"}}); }, {"quantization_config", "'quant_method'"});
  expect_error([] { with_quant(42); }, {"quantization_config must be an object", "42"});
  expect_error(
      [] {
        with_quant({{"quant_method", "fp8"}, {"modules_to_not_convert", {1}}});
      },
      {"quantization_config.modules_to_not_convert", "non-string"});
}

// One DeepSeek-V3 expert in fp8: 3 x 7168 x 2048 bytes + fp32 scales of the gate's and the up's
// 16 x 56 tiles and the down's 56 x 16 (DESIGN.md §9: 44.0 MB).
TEST(Fp8Spec, Fp8BytesCountWeightsAndTileScales) {
  const MoeSpec s = load_spec("deepseek-v3");
  EXPECT_EQ(s.fp8_expert_bytes(), size_t{3} * 7168 * 2048 + 4 * (2 * 16 * 56 + 56 * 16));
  EXPECT_EQ(s.fp8_shared_bytes(), s.fp8_expert_bytes());  // one shared expert of width I
  EXPECT_EQ(s.expert_bytes(), size_t{3} * 7168 * 2048 * 2);
  // Edge tiles count as whole tiles: H = 3072, I = 1536 (MiniMax-M2) and a partial case.
  const MoeSpec m = load_spec("minimax-m2");
  EXPECT_EQ(m.fp8_expert_bytes(), size_t{3} * 3072 * 1536 + 4 * (3 * 12 * 24));
  EXPECT_EQ(m.fp8_shared_bytes(), 0u);
}

}  // namespace
}  // namespace moekit
