// quantization_config for the OCP MX formats: gpt-oss's "mxfp4" and a MiniMax-M3-style "mxfp8"
// ([1, 32] blocks, e4m3, dynamic activations) parse to their QuantKind with the MX block; other
// block sizes, formats or schemes are errors naming the key and value; the packed byte counts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "expect_error.h"
#include "moekit/spec.h"
#include "moekit/weights.h"
#include "mx_test_util.h"

namespace moekit {
namespace {

using test::expect_error;

MoeSpec minimax_with(const nlohmann::json& quant) {
  return test::mx_spec("minimax-m3", 96, 64, 8, 1, quant);
}

TEST(MxSpec, PublishedAndMiniMaxStyleConfigs) {
  const MoeSpec g = load_spec("gpt-oss-120b");
  EXPECT_EQ(g.quant.kind, QuantKind::Mxfp4);
  EXPECT_TRUE(g.mx_experts());
  EXPECT_FALSE(g.fp8_experts());
  EXPECT_EQ(g.quant.block_out, 1);
  EXPECT_EQ(g.quant.block_in, 32);
  const MoeSpec m = minimax_with(test::mxfp8_quant());
  EXPECT_EQ(m.quant.kind, QuantKind::Mxfp8);
  EXPECT_STREQ(quant_kind_name(m.quant.kind), "mxfp8");
  EXPECT_EQ(m.quant.block_out, 1);
  EXPECT_EQ(m.quant.block_in, 32);
  EXPECT_EQ(m.quant.activation_scheme, "dynamic");
  EXPECT_EQ(m.quant.modules_to_not_convert,
            (std::vector<std::string>{"gate", "e_score_correction_bias", "lm_head"}));
  // weight_block_size, fmt and activation_scheme default to the MX block, e4m3 and dynamic
  EXPECT_EQ(minimax_with({{"quant_method", "mxfp8"}}).quant.block_in, 32);
  EXPECT_EQ(load_spec("minimax-m3").quant.kind, QuantKind::None);
}

TEST(MxSpec, UnsupportedMxfp8ValuesAreErrors) {
  expect_error([] { minimax_with({{"quant_method", "mxfp8"}, {"weight_block_size", {1, 16}}}); },
               {"quantization_config.weight_block_size = [1, 16]", "expected [1, 32]"});
  expect_error([] { minimax_with({{"quant_method", "mxfp8"}, {"weight_block_size", {128, 128}}}); },
               {"[128, 128] is not supported for mxfp8"});
  expect_error([] { minimax_with({{"quant_method", "mxfp8"}, {"fmt", "e5m2"}}); },
               {"quantization_config.fmt = 'e5m2'", "mxfp8"});
  expect_error([] { minimax_with({{"quant_method", "mxfp8"}, {"activation_scheme", "static"}}); },
               {"activation_scheme = 'static'", "expected dynamic"});
}

TEST(MxSpec, PackedBytes) {
  const MoeSpec g = load_spec("gpt-oss-120b");
  const size_t e = 3ull * g.expert_intermediate * g.hidden;
  EXPECT_EQ(g.mx_expert_bytes(), e / 2 + e / 32);  // 4.25 bits a weight
  EXPECT_EQ(g.mx_shared_bytes(), 0u);
  const MoeSpec m = minimax_with(test::mxfp8_quant());
  EXPECT_EQ(m.mx_expert_bytes(), size_t{3} * 64 * 96 * 33 / 32);  // 8.25 bits a weight
  EXPECT_EQ(m.mx_shared_bytes(), size_t{3} * 64 * 96 * 33 / 32);
  EXPECT_EQ(load_spec("deepseek-v3").mx_expert_bytes(), 0u);
}

TEST(MxSpec, ExpertFormatNamesRoundTrip) {
  for (ExpertFormat f :
       {ExpertFormat::Bf16, ExpertFormat::Fp8Block, ExpertFormat::Mxfp4, ExpertFormat::Mxfp8})
    EXPECT_EQ(parse_expert_format(expert_format_name(f)), f);
  expect_error([] { parse_expert_format("nvfp4"); },
               {"unknown expert format 'nvfp4'", "bf16, fp8, mxfp4 or mxfp8"});
}

}  // namespace
}  // namespace moekit
