// The bad-input catalogue, configs: a real configs/<model>.json with one thing broken, text that
// is not a JSON object, and config paths or fusion requests the model cannot satisfy. Each is
// refused with a moekit::Error whose text names the key and the value. Each catalogue entry is one
// ctest case (value-parameterised), named after what is wrong. The catalogue goes on in
// test_bad_checkpoints.cpp, test_bad_cli.cpp and test_bad_api.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "expect_error.h"
#include "io_test_util.h"
#include "moekit/spec.h"

namespace moekit {
namespace {

using nlohmann::json;
using test::expect_error;
using test::model_config;
using test::scratch_dir;

struct ConfigCase {
  const char* name;
  const char* model;                   // configs/<model>.json as the starting point
  std::function<void(json&)> mutate;   // the breakage (on text_config for nested configs)
  std::vector<std::string> fragments;  // the error must name these
  const char* raw = nullptr;           // instead of model + mutate: this text
};

void PrintTo(const ConfigCase& c, std::ostream* os) { *os << c.name; }

class BadConfig : public ::testing::TestWithParam<ConfigCase> {};

TEST_P(BadConfig, RefusedNamingKeyAndValue) {
  const ConfigCase& c = GetParam();
  std::string text;
  if (c.raw) {
    text = c.raw;
  } else {
    json top = model_config(c.model);
    c.mutate(top.contains("text_config") ? top["text_config"] : top);
    text = top.dump();
  }
  expect_error([&] { parse_spec_json(text, "bad"); }, c.fragments);
}

const ConfigCase kConfigCases[] = {
    {"NotJson", "", nullptr, {"config 'bad' is not valid JSON"}, "{\"hidden_size\": 7168,"},
    // Found by fuzz/fuzz_spec: nlohmann throws out_of_range (not parse_error) for a number
    // beyond double, which escaped parse_spec_json as a foreign exception.
    {"NumberBeyondDouble",
     "",
     nullptr,
     {"config 'bad' is not valid JSON", "number overflow"},
     R"({"model_type": "deepseek_v3", "hidden_size": 9e956})"},
    {"NotAnObject", "", nullptr, {"config 'bad' must be a JSON object, got array"}, "[1, 2]"},
    {"MissingModelType",
     "mixtral-8x7b",
     [](json& c) {
       c.erase("model_type");
       c.erase("architectures");
     },
     {"missing key 'model_type'"}},
    {"MissingHiddenSize",
     "deepseek-v3",
     [](json& c) { c["hidden_size"] = nullptr; },  // absent would take the class default
     {"missing key 'hidden_size'"}},
    {"ZeroHiddenSize",
     "deepseek-v3",
     [](json& c) { c["hidden_size"] = 0; },
     {"'hidden_size' must be a positive size, got 0"}},
    {"NegativeIntermediate",
     "deepseek-v3",
     [](json& c) { c["moe_intermediate_size"] = -2048; },
     {"'moe_intermediate_size' must be a positive size, got -2048"}},
    {"HiddenSizeAsString",
     "deepseek-v3",
     [](json& c) { c["hidden_size"] = "7168"; },
     {"key 'hidden_size' must be an integer, got \"7168\""}},
    {"HiddenSizeAsFloat",
     "qwen3-30b-a3b",
     [](json& c) { c["hidden_size"] = 2048.5; },
     {"key 'hidden_size' must be an integer, got 2048.5"}},
    {"MissingExpertCount",
     "deepseek-v3",
     [](json& c) { c["n_routed_experts"] = nullptr; },
     {"missing key 'n_routed_experts' or 'num_experts' or 'num_local_experts'"}},
    {"TopKAboveExperts",
     "deepseek-v3",
     [](json& c) { c["num_experts_per_tok"] = 300; },
     {"num_experts_per_tok = 300", "number of experts = 256"}},
    {"ExpertsNotDivisibleByGroups",
     "deepseek-v3",
     [](json& c) { c["n_group"] = 7; },
     {"number of experts = 256 is not divisible by n_group = 7"}},
    {"TopkGroupAboveGroups",
     "deepseek-v3",
     [](json& c) { c["topk_group"] = 9; },
     {"topk_group = 9 must be in [1, n_group = 8]"}},
    {"TopKBeyondKeptGroups",
     "deepseek-v3",
     [](json& c) {
       c["topk_group"] = 1;
       c["num_experts_per_tok"] = 33;
     },
     {"num_experts_per_tok = 33 exceeds the 32 experts of the topk_group = 1 groups kept"}},
    {"UnknownScoringFunction",
     "deepseek-v3",
     [](json& c) { c["scoring_func"] = "relu"; },
     {"unknown 'scoring_func' = 'relu'"}},
    {"UnknownActivation",
     "qwen3-30b-a3b",
     [](json& c) { c["hidden_act"] = "gelu"; },
     {"unsupported 'hidden_act' = 'gelu'"}},
    {"UnknownRouterDtype",
     "minimax-m2",
     [](json& c) { c["router_dtype"] = "int8"; },
     {"unknown 'router_dtype' = 'int8'"}},
    {"NegativeRoutedScaling",
     "deepseek-v3",
     [](json& c) { c["routed_scaling_factor"] = -2.5; },
     {"routed_scaling_factor must be a positive number, got -2.5"}},
    {"RoutedScalingAsString",
     "deepseek-v3",
     [](json& c) { c["routed_scaling_factor"] = "2.5"; },
     {"key 'routed_scaling_factor' must be a number, got \"2.5\""}},
    {"NormTopkProbNotBool",
     "qwen3-30b-a3b",
     [](json& c) { c["norm_topk_prob"] = "yes"; },
     {"key 'norm_topk_prob' must be true or false, got \"yes\""}},
    {"NegativeSwigluLimit",
     "deepseek-v3",
     [](json& c) { c["swiglu_limit"] = -7.0; },
     {"swiglu_limit must be >= 0, got -7"}},
    {"DenseReplaceBeyondLayers",
     "deepseek-v3",
     [](json& c) { c["first_k_dense_replace"] = 100; },
     {"'first_k_dense_replace' = 100 outside [0, num_hidden_layers = 61]"}},
    {"AllLayersDense",
     "deepseek-v3",
     [](json& c) { c["first_k_dense_replace"] = 61; },
     {"no layer of the 61 is an MoE layer"}},
    {"HugeLayerCount",
     "mixtral-8x7b",
     [](json& c) { c["num_hidden_layers"] = 1 << 30; },
     {"'num_hidden_layers' = 1073741824 exceeds 65536"}},
    {"SharedWidthOverflowsInt",
     "deepseek-v3",
     [](json& c) { c["n_shared_experts"] = 1 << 30; },
     {"'n_shared_experts * moe_intermediate_size' must be a positive size, got 2199023255552"}},
    {"NegativeSharedExperts",
     "mixtral-8x7b",
     [](json& c) { c["n_shared_experts"] = -1; },
     {"shared expert sizes must not be negative"}},
    {"HashLayersBeyondLayers",
     "deepseek-v4-flash",
     [](json& c) { c["num_hash_layers"] = 100; },
     {"num_hash_layers = 100 outside [0, 43]"}},
    {"MoeLayerFreqWrongLength",
     "minimax-m3",
     [](json& c) {
       c["moe_layer_freq"] = {0, 1, 1};
     },
     {"'moe_layer_freq' has 3 entries, expected num_hidden_layers = 60"}},
    {"MlpOnlyLayersNotAList",
     "qwen3-30b-a3b",
     [](json& c) { c["mlp_only_layers"] = 3; },
     {"'mlp_only_layers' must be a list"}},
    {"ZeroSparseStep",
     "qwen3-30b-a3b",
     [](json& c) { c["decoder_sparse_step"] = 0; },
     {"'decoder_sparse_step' must be >= 1, got 0"}},
};

INSTANTIATE_TEST_SUITE_P(Catalogue, BadConfig, ::testing::ValuesIn(kConfigCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(BadConfigFile, UnknownShortNameListsKnownModels) {
  expect_error([] { load_spec("no-such-model"); },
               {"unknown model 'no-such-model'", "known models:", "deepseek-v3"});
}

TEST(BadConfigFile, MissingPath) {
  expect_error([] { load_spec("/nonexistent/dir/config.json"); },
               {"config file '/nonexistent/dir/config.json' does not exist"});
}

TEST(BadConfigFile, DirectoryWithoutConfigJson) {
  const std::string dir = scratch_dir();
  expect_error([&] { load_spec(dir); }, {"directory '" + dir + "' holds no config.json"});
}

TEST(BadConfigFile, FusionAskedWithoutSharedExpert) {
  const MoeSpec s = load_spec("mixtral-8x7b");
  expect_error([&] { validate_spec(s, /*require_fusable=*/true); },
               {"shared-expert fusion asked for, but the model has no shared expert"});
}

TEST(BadConfigFile, FusionAskedWithPartialSharedWidth) {
  json c = model_config("qwen2-57b-a14b");
  c["shared_expert_intermediate_size"] = 3000;  // not a multiple of 2560
  const MoeSpec s = parse_spec_json(c.dump(), "qwen2-odd");
  EXPECT_EQ(s.shared_slots(), 0);
  expect_error([&] { validate_spec(s, true); },
               {"shared width = 3000", "expert intermediate size = 2560"});
}

}  // namespace
}  // namespace moekit
