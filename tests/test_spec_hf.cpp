// Configs as transformers reads them (src/spec/transformers_defaults.cpp): the fixtures under
// tests/configs_hf are written by transformers' own config classes
// (scripts/golden/make_hf_configs.py), and moekit must read each to the spec that transformers'
// modeling code runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "expect_error.h"
#include "moekit/checkpoint.h"
#include "moekit/layer.h"
#include "moekit/spec.h"
#include "moekit/weights.h"
#include "shrunk_spec.h"
#include "spec/transformers_defaults.h"

namespace moekit {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

const std::string kRoot = std::string(MOEKIT_TEST_DATA_DIR) + "/..";
const std::string kHfDir = std::string(MOEKIT_TEST_DATA_DIR) + "/configs_hf";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json load_json(const std::string& path) { return json::parse(slurp(path)); }

// The spec's fields under the names make_hf_configs.py writes in expected_defaults.json, plus
// moekit's own (router dtype, biases) for spec-to-spec comparisons.
json fields(const MoeSpec& s) {
  return {{"hidden", s.hidden},
          {"num_experts", s.num_experts},
          {"top_k", s.top_k},
          {"expert_intermediate", s.expert_intermediate},
          {"num_layers", s.num_layers},
          {"moe_layers", s.moe_layers},
          {"scoring", scoring_name(s.scoring)},
          {"has_correction_bias", s.has_correction_bias},
          {"group_score_top2_sum", s.group_score_top2_sum},
          {"n_group", s.n_group},
          {"topk_group", s.topk_group},
          {"renormalize", s.renormalize},
          {"routed_scaling_factor", s.routed_scaling_factor},
          {"activation", activation_name(s.activation)},
          {"swiglu_limit", s.swiglu_limit},
          {"swiglu_alpha", s.swiglu_alpha},
          {"swiglu_beta", s.swiglu_beta},
          {"shared_kind", shared_kind_name(s.shared_kind)},
          {"shared_intermediate", s.shared_intermediate},
          {"num_hash_layers", s.num_hash_layers},
          {"router_dtype", dtype_name(s.router_dtype)},
          {"has_router_bias", s.has_router_bias},
          {"has_expert_bias", s.has_expert_bias},
          {"model_type", s.model_type}};
}

bool same_value(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return std::fabs(x - y) <= 1e-6 * std::fmax(1.0, std::fabs(y));
  }
  return a == b;
}

// Every key of `want` has the same value in `got`.
void expect_fields(const json& got, const json& want, const std::string& what) {
  for (const auto& [key, value] : want.items()) {
    ASSERT_TRUE(got.contains(key)) << what << ": spec has no field " << key;
    EXPECT_TRUE(same_value(got.at(key), value))
        << what << ": " << key << " = " << got.at(key).dump() << ", expected " << value.dump();
  }
}

MoeSpec parse_file(const std::string& path) { return parse_spec_json(slurp(path), path); }

TEST(SpecHf, DefaultTablesAreTheTransformersClassDefaults) {
  const json fixture = load_json(kHfDir + "/class_defaults.json");
  std::vector<std::string> covered;
  for (const auto& [type, defaults] : fixture.at("defaults").items()) {
    const std::string mt = type == "minimax_m3_vl" ? "minimax_m3" : type;
    covered.push_back(mt);
    const json& table = spec_internal::transformers_defaults(mt);
    EXPECT_EQ(table.size() - (mt == "deepseek_v4" ? 1 : 0), defaults.size())
        << mt << ": table " << table.dump() << "\nclass " << defaults.dump();
    for (const auto& [key, value] : defaults.items()) {
      ASSERT_TRUE(table.contains(key)) << mt << ": no default for '" << key << "'";
      EXPECT_TRUE(same_value(table.at(key), value))
          << mt << " '" << key << "': table " << table.at(key).dump() << ", transformers "
          << value.dump() << " (transformers " << fixture.at("transformers_version") << ")";
    }
  }
  std::sort(covered.begin(), covered.end());
  EXPECT_EQ(covered, supported_model_types());
}

// save_pretrained() of each default-constructed config class.
TEST(SpecHf, DefaultConstructedConfigsGiveTheSpecTransformersRuns) {
  const json expected = load_json(kHfDir + "/expected_defaults.json").at("specs");
  ASSERT_EQ(expected.size(), supported_model_types().size() - 1);  // kimi_k2 has no class
  for (const auto& [type, want] : expected.items()) {
    const std::string path = kHfDir + "/" + type + ".default.json";
    SCOPED_TRACE(path);
    if (want.contains("error")) {
      // DeepseekV2Config's num_experts_per_tok defaults to None: transformers cannot run it.
      test::expect_error([&] { parse_file(path); },
                         {"missing key", want.at("error").get<std::string>()});
      continue;
    }
    expect_fields(fields(parse_file(path)), want, type);
  }
}

// Each published config, and the same config built by transformers and saved (resaved), and the
// saved file without every key at its class default (stripped): one spec.
TEST(SpecHf, ResavedAndStrippedConfigsGiveThePublishedSpec) {
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(kRoot + "/configs")) {
    if (entry.path().extension() != ".json") continue;
    const std::string model = entry.path().stem().string();
    const json published = fields(parse_file(entry.path().string()));
    for (const char* variant : {".resaved.json", ".stripped.json"}) {
      const std::string path = kHfDir + "/" + model + variant;
      ASSERT_TRUE(fs::exists(path))
          << "no fixture " << path << " (scripts/golden/make_hf_configs.py writes it)";
      SCOPED_TRACE(path);
      expect_fields(fields(parse_file(path)), published, model + variant);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 26);
}

TEST(SpecHf, StrippedConfigsReallyOmitTheKeys) {
  const json v3 = load_json(kHfDir + "/deepseek-v3.stripped.json");
  for (const char* key : {"hidden_size", "n_routed_experts", "topk_method", "scoring_func",
                          "n_group", "first_k_dense_replace"})
    EXPECT_FALSE(v3.contains(key)) << key;
  const json m3 = load_json(kHfDir + "/minimax-m3.resaved.json").at("text_config");
  EXPECT_FALSE(m3.contains("moe_layer_freq"));
  EXPECT_FALSE(m3.contains("use_routing_bias"));
  EXPECT_EQ(m3.at("hidden_act"), "silu");  // MiniMaxM3VLTextConfig resets it
}

json published(const std::string& model) {
  return load_json(kRoot + "/configs/" + model + ".json");
}

TEST(SpecHf, DeepSeekV3WithoutTopkMethodOrScoringFuncRoutesNoauxTc) {
  json cfg = published("deepseek-v3");
  cfg.erase("topk_method");
  cfg.erase("scoring_func");
  const MoeSpec s = parse_spec_json(cfg.dump(), "v3-no-topk-method");
  EXPECT_EQ(s.scoring, Scoring::Sigmoid);
  EXPECT_TRUE(s.has_correction_bias);
  EXPECT_TRUE(s.group_score_top2_sum);
  EXPECT_EQ(s.n_group, 8);
  EXPECT_EQ(s.topk_group, 4);
  // What the file says does not change what transformers' router does.
  cfg["topk_method"] = "greedy";
  cfg["scoring_func"] = "softmax";
  const MoeSpec t = parse_spec_json(cfg.dump(), "v3-greedy-softmax");
  EXPECT_EQ(fields(t).dump(), fields(s).dump());
}

TEST(SpecHf, DeepSeekV3WithoutTopkMethodRoutesLikeThePublishedConfig) {
  // A DeepSeek-V3 layer shrunk to H = 64, E = 32 (8 groups of 4), run through the reference: the
  // same experts and outputs as the published config, which says noaux_tc + sigmoid.
  auto shrink = [](json cfg) {
    cfg["hidden_size"] = 64;
    cfg["moe_intermediate_size"] = 16;
    cfg["n_routed_experts"] = 32;
    return cfg;
  };
  json stripped = shrink(published("deepseek-v3"));
  stripped.erase("topk_method");
  stripped.erase("scoring_func");
  const MoeSpec a = parse_spec_json(shrink(published("deepseek-v3")).dump(), "v3-small");
  const MoeSpec b = parse_spec_json(stripped.dump(), "v3-small-stripped");
  const int layer = a.moe_layers.front(), tokens = 16;
  const auto wa = make_random_weights(a, layer, 7);
  const auto wb = make_random_weights(b, layer, 7);
  const auto x = test::random_input(tokens, a.hidden, 3, 1.0f);
  const ForwardResult ra = cpu_reference::forward(*wa, x.data(), tokens, FuseShared::Off);
  const ForwardResult rb = cpu_reference::forward(*wb, x.data(), tokens, FuseShared::Off);
  EXPECT_EQ(ra.routing.ids, rb.routing.ids);
  EXPECT_EQ(ra.routing.weights, rb.routing.weights);
  EXPECT_EQ(ra.y, rb.y);
}

TEST(SpecHf, MiniMaxM3ResavedKeepsSwigluOaiAndItsDenseLayers) {
  const MoeSpec s = parse_file(kHfDir + "/minimax-m3.resaved.json");
  EXPECT_EQ(s.model_type, "minimax_m3");
  EXPECT_EQ(s.activation, Activation::SwigluOai);
  EXPECT_EQ(s.moe_layers.front(), 3);
  EXPECT_EQ(s.moe_layers.size(), 57u);
  EXPECT_TRUE(s.has_correction_bias);
}

TEST(SpecHf, DeepSeekV4HashLayersFromMlpLayerTypes) {
  json cfg = published("deepseek-v4-flash");
  cfg.erase("num_hash_layers");
  std::vector<std::string> types(cfg["num_hidden_layers"].get<int>(), "moe");
  types[0] = types[1] = "hash_moe";
  cfg["mlp_layer_types"] = types;
  EXPECT_EQ(parse_spec_json(cfg.dump(), "v4").num_hash_layers, 2);
  types[5] = "hash_moe";
  cfg["mlp_layer_types"] = types;
  test::expect_error([&] { parse_spec_json(cfg.dump(), "v4"); },
                     {"'mlp_layer_types'[5] is \"hash_moe\" after a score-routed layer"});
  cfg["mlp_layer_types"] = std::vector<std::string>(3, "moe");
  test::expect_error([&] { parse_spec_json(cfg.dump(), "v4"); },
                     {"'mlp_layer_types' has 3 entries, expected num_hidden_layers = 43"});
  // Without either key, DeepseekV4Config makes the first 3 layers hash-routed.
  cfg.erase("mlp_layer_types");
  EXPECT_EQ(parse_spec_json(cfg.dump(), "v4").num_hash_layers, 3);
}

TEST(SpecHf, UnknownModelTypeIsAnErrorNamingTheSupportedOnes) {
  json cfg = published("qwen3-30b-a3b");
  cfg["model_type"] = "llama4";
  test::expect_error([&] { parse_spec_json(cfg.dump(), "cfg"); },
                     {"config 'cfg': unsupported model_type 'llama4'",
                      "supported: deepseek_v2, deepseek_v3, deepseek_v32, deepseek_v4, glm4_moe, "
                      "glm_moe_dsa, gpt_oss, kimi_k2, minimax_m2, minimax_m3, mixtral, "
                      "qwen2_moe, qwen3_moe",
                      "allow_generic_moe"});
  // Asked for explicitly, it runs as a generic top-k MoE: softmax, the file's keys only.
  SpecOptions generic;
  generic.allow_generic_moe = true;
  const MoeSpec s = parse_spec_json(cfg.dump(), "cfg", generic);
  EXPECT_EQ(s.model_type, "llama4");
  EXPECT_EQ(s.num_experts, 128);
  EXPECT_EQ(s.scoring, Scoring::Softmax);
  EXPECT_TRUE(s.renormalize);
  cfg.erase("hidden_size");  // no family defaults for a generic MoE
  test::expect_error([&] { parse_spec_json(cfg.dump(), "cfg", generic); },
                     {"missing key 'hidden_size'"});
}

TEST(SpecHf, CheckpointCorrectionBiasUnderBiasFreeRoutingIsAnError) {
  // A DeepSeek-V3-shaped checkpoint (with its correction bias) read with a generic spec that
  // routes without one: the bias must not be dropped silently.
  json cfg = published("deepseek-v3");
  cfg["hidden_size"] = 64;
  cfg["moe_intermediate_size"] = 16;
  cfg["n_routed_experts"] = 32;
  const MoeSpec v3 = parse_spec_json(cfg.dump(), "v3-small");
  const std::string dir = (fs::temp_directory_path() / "moekit_spec_hf_unused_bias").string();
  fs::remove_all(dir);
  const int layer = v3.moe_layers.front();
  save_checkpoint(*make_random_weights(v3, layer, 5), dir);
  cfg["model_type"] = "my_moe";
  cfg.erase("topk_method");
  SpecOptions generic;
  generic.allow_generic_moe = true;
  const MoeSpec plain = parse_spec_json(cfg.dump(), "generic-small", generic);
  ASSERT_FALSE(plain.has_correction_bias);
  test::expect_error([&] { load_checkpoint_weights(plain, layer, dir); },
                     {"gate.e_score_correction_bias", "a routing correction bias",
                      "spec generic-small", "routes without one"});
  EXPECT_NO_THROW(load_checkpoint_weights(v3, layer, dir));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moekit
