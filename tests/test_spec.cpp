// Every config in configs/ parses to the spec DESIGN.md §5 gives; malformed configs are answered
// by an error naming the key and the value.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moekit/error.h"
#include "moekit/spec.h"

using moekit::DType;
using moekit::MoeSpec;
using moekit::Scoring;
using moekit::SharedKind;
using ::testing::HasSubstr;

namespace {

struct Expected {
  const char* name;
  int hidden, experts, top_k, inter, shared_width, slots, n_group, topk_group;
  Scoring scoring;
  bool bias, renorm;
  float rsf;
  DType router;
  int moe_layers, layers, first_moe;
};

// From DESIGN.md §5 (the model table) and the configs' own keys.
const Expected kExpected[] = {
    {"deepseek-v3", 7168, 256, 8, 2048, 2048, 1, 8, 4, Scoring::Sigmoid, true, true, 2.5f,
     DType::BF16, 58, 61, 3},
    {"kimi-k2", 7168, 384, 8, 2048, 2048, 1, 1, 1, Scoring::Sigmoid, true, true, 2.827f,
     DType::BF16, 60, 61, 1},
    {"glm-4.5", 5120, 160, 8, 1536, 1536, 1, 1, 1, Scoring::Sigmoid, true, true, 2.5f, DType::BF16,
     89, 92, 3},
    {"glm-5", 6144, 256, 8, 2048, 2048, 1, 1, 1, Scoring::Sigmoid, true, true, 2.5f, DType::BF16,
     75, 78, 3},
    {"minimax-m2", 3072, 256, 8, 1536, 0, 0, 1, 1, Scoring::Sigmoid, true, true, 1.0f, DType::F32,
     62, 62, 0},
    {"minimax-m3", 6144, 128, 4, 3072, 3072, 1, 1, 1, Scoring::Sigmoid, true, true, 2.0f,
     DType::F32, 57, 60, 3},
    {"deepseek-v4-flash", 4096, 256, 6, 2048, 2048, 1, 1, 1, Scoring::SqrtSoftplus, true, true,
     1.5f, DType::F32, 43, 43, 0},
    {"qwen3-30b-a3b", 2048, 128, 8, 768, 0, 0, 1, 1, Scoring::Softmax, false, true, 1.0f,
     DType::BF16, 48, 48, 0},
    {"qwen3-235b-a22b", 4096, 128, 8, 1536, 0, 0, 1, 1, Scoring::Softmax, false, true, 1.0f,
     DType::BF16, 94, 94, 0},
    {"qwen2-57b-a14b", 3584, 64, 8, 2560, 20480, 8, 1, 1, Scoring::Softmax, false, false, 1.0f,
     DType::BF16, 28, 28, 0},
    {"mixtral-8x7b", 4096, 8, 2, 14336, 0, 0, 1, 1, Scoring::Softmax, false, true, 1.0f,
     DType::BF16, 32, 32, 0},
    {"gpt-oss-120b", 2880, 128, 4, 2880, 0, 0, 1, 1, Scoring::SoftmaxOfTopk, false, false, 1.0f,
     DType::BF16, 36, 36, 0},
    {"deepseek-v2-lite", 2048, 64, 6, 1408, 2816, 2, 1, 1, Scoring::Softmax, false, false, 1.0f,
     DType::BF16, 26, 27, 1},
};

class SpecOfEveryConfig : public ::testing::TestWithParam<Expected> {};

TEST_P(SpecOfEveryConfig, MatchesTheModelTable) {
  const Expected& e = GetParam();
  const MoeSpec s = moekit::load_spec(e.name);
  EXPECT_EQ(s.hidden, e.hidden);
  EXPECT_EQ(s.num_experts, e.experts);
  EXPECT_EQ(s.top_k, e.top_k);
  EXPECT_EQ(s.expert_intermediate, e.inter);
  EXPECT_EQ(s.shared_intermediate, e.shared_width);
  EXPECT_EQ(s.shared_slots(), e.slots);
  EXPECT_EQ(s.n_group, e.n_group);
  EXPECT_EQ(s.topk_group, e.topk_group);
  EXPECT_EQ(s.scoring, e.scoring);
  EXPECT_EQ(s.has_correction_bias, e.bias);
  EXPECT_EQ(s.renormalize, e.renorm);
  EXPECT_FLOAT_EQ(s.routed_scaling_factor, e.rsf);
  EXPECT_EQ(s.router_dtype, e.router);
  EXPECT_EQ(static_cast<int>(s.moe_layers.size()), e.moe_layers);
  EXPECT_EQ(s.num_layers, e.layers);
  EXPECT_EQ(s.moe_layers.front(), e.first_moe);
  EXPECT_EQ(s.moe_layers.back(), e.layers - 1);
}

INSTANTIATE_TEST_SUITE_P(Configs, SpecOfEveryConfig, ::testing::ValuesIn(kExpected),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& c : n)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

TEST(Spec, EveryShippedConfigIsCovered) {
  const auto names = moekit::list_model_names();
  EXPECT_EQ(names.size(), std::size(kExpected));
  for (const auto& n : names) {
    bool found = false;
    for (const auto& e : kExpected) found = found || n == e.name;
    EXPECT_TRUE(found) << n << " has no expected row";
  }
}

TEST(Spec, FamilySpecificFields) {
  const MoeSpec v3 = moekit::load_spec("deepseek-v3");
  EXPECT_TRUE(v3.group_score_top2_sum);
  EXPECT_EQ(v3.shared_kind, SharedKind::Plain);
  EXPECT_EQ(v3.router_columns(), 256);
  const MoeSpec q2 = moekit::load_spec("qwen2-57b-a14b");
  EXPECT_EQ(q2.shared_kind, SharedKind::Gated);
  EXPECT_EQ(q2.router_columns(), 65);  // the gate logit rides as column E
  const MoeSpec oss = moekit::load_spec("gpt-oss-120b");
  EXPECT_EQ(oss.activation, moekit::Activation::SwigluOaiInterleaved);
  EXPECT_TRUE(oss.has_router_bias);
  EXPECT_TRUE(oss.has_expert_bias);
  EXPECT_FLOAT_EQ(oss.swiglu_limit, 7.0f);
  const MoeSpec m3 = moekit::load_spec("minimax-m3");
  EXPECT_EQ(m3.activation, moekit::Activation::SwigluOai);
  EXPECT_FLOAT_EQ(m3.swiglu_alpha, 1.702f);
  const MoeSpec v4 = moekit::load_spec("deepseek-v4-flash");
  EXPECT_FLOAT_EQ(v4.swiglu_limit, 10.0f);
  EXPECT_EQ(v4.num_hash_layers, 3);
  EXPECT_EQ(v3.expert_bytes(), size_t{3} * 2048 * 7168 * 2);
}

TEST(Spec, PathAndDirectoryAndShortNameAgree) {
  const std::string path = moekit::config_dir() + "/qwen3-30b-a3b.json";
  EXPECT_EQ(moekit::load_spec(path).hidden, moekit::load_spec("qwen3-30b-a3b").hidden);
  EXPECT_THAT(moekit::load_spec(path).source_path, HasSubstr("qwen3-30b-a3b.json"));
}

// --- malformed configs: each must name the problem ---

nlohmann::json base_config() {
  std::ifstream in(moekit::config_dir() + "/deepseek-v3.json");
  return nlohmann::json::parse(in);
}

std::string error_of(const nlohmann::json& cfg) {
  try {
    moekit::parse_spec_json(cfg.dump(), "bad");
  } catch (const moekit::Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct BadConfig {
  const char* what;
  void (*edit)(nlohmann::json&);
  const char* expected_error;
};

const BadConfig kBadConfigs[] = {
    // null, not absent: an absent key takes the transformers class default (test_spec_hf.cpp).
    {"null hidden_size", [](nlohmann::json& c) { c["hidden_size"] = nullptr; },
     "missing key 'hidden_size'"},
    {"null expert count",
     [](nlohmann::json& c) { c["n_routed_experts"] = nullptr; },
     "missing key 'n_routed_experts' or 'num_experts' or 'num_local_experts'"},
    {"top_k > experts", [](nlohmann::json& c) { c["num_experts_per_tok"] = 300; },
     "num_experts_per_tok = 300 must be in [1, number of experts = 256]"},
    {"experts not divisible by n_group", [](nlohmann::json& c) { c["n_group"] = 7; },
     "number of experts = 256 is not divisible by n_group = 7"},
    {"topk_group > n_group", [](nlohmann::json& c) { c["topk_group"] = 9; },
     "topk_group = 9 must be in [1, n_group = 8]"},
    {"unknown scoring", [](nlohmann::json& c) { c["scoring_func"] = "relu"; },
     "unknown 'scoring_func' = 'relu'"},
    {"zero hidden", [](nlohmann::json& c) { c["hidden_size"] = 0; },
     "'hidden_size' must be a positive size, got 0"},
    {"negative intermediate", [](nlohmann::json& c) { c["moe_intermediate_size"] = -5; },
     "'moe_intermediate_size' must be a positive size, got -5"},
    {"string where integer", [](nlohmann::json& c) { c["hidden_size"] = "7168"; },
     "key 'hidden_size' must be an integer, got \"7168\""},
    {"too few groups kept for top_k",
     [](nlohmann::json& c) {
       c["topk_group"] = 1;
       c["num_experts_per_tok"] = 40;
     },
     "num_experts_per_tok = 40 exceeds the 32 experts of the topk_group = 1 groups kept"},
    {"negative scaling", [](nlohmann::json& c) { c["routed_scaling_factor"] = -1.0; },
     "routed_scaling_factor must be a positive number, got -1"},
    {"unknown activation", [](nlohmann::json& c) { c["hidden_act"] = "gelu"; },
     "unsupported 'hidden_act' = 'gelu'"},
    {"dense prefix beyond layers", [](nlohmann::json& c) { c["first_k_dense_replace"] = 99; },
     "'first_k_dense_replace' = 99 outside [0, num_hidden_layers = 61]"},
    {"bool as number", [](nlohmann::json& c) { c["norm_topk_prob"] = 1; },
     "key 'norm_topk_prob' must be true or false, got 1"},
    {"no model type", [](nlohmann::json& c) {
       c.erase("model_type");
       c.erase("architectures");
     },
     "missing key 'model_type'"},
    {"unknown router dtype", [](nlohmann::json& c) { c["router_dtype"] = "int8"; },
     "unknown 'router_dtype' = 'int8'"},
};

class MalformedConfig : public ::testing::TestWithParam<BadConfig> {};

TEST_P(MalformedConfig, ErrorNamesTheProblem) {
  nlohmann::json cfg = base_config();
  GetParam().edit(cfg);
  EXPECT_THAT(error_of(cfg), HasSubstr(GetParam().expected_error)) << GetParam().what;
}

void PrintTo(const BadConfig& c, std::ostream* os) { *os << c.what; }

INSTANTIATE_TEST_SUITE_P(Catalogue, MalformedConfig, ::testing::ValuesIn(kBadConfigs),
                         [](const auto& info) {
                           std::string n = info.param.what;
                           for (char& c : n) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

TEST(Spec, NotJsonAndNotObject) {
  EXPECT_THROW(
      {
        try {
          moekit::parse_spec_json("{\"hidden_size\": 12", "trunc");
        } catch (const moekit::Error& e) {
          EXPECT_THAT(e.what(), HasSubstr("config 'trunc' is not valid JSON"));
          throw;
        }
      },
      moekit::Error);
  try {
    moekit::parse_spec_json("[1,2]", "arr");
    FAIL() << "no error";
  } catch (const moekit::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("must be a JSON object, got array"));
  }
}

TEST(Spec, UnknownModelListsKnownOnes) {
  try {
    moekit::load_spec("deepseek-v9");
    FAIL() << "no error";
  } catch (const moekit::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown model 'deepseek-v9'"));
    EXPECT_THAT(e.what(), HasSubstr("deepseek-v3"));
  }
  try {
    moekit::load_spec("/nonexistent/config.json");
    FAIL() << "no error";
  } catch (const moekit::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("config file '/nonexistent/config.json' does not exist"));
  }
}

TEST(Spec, FusionNeedsWholeMultipleOfExpertWidth) {
  nlohmann::json cfg;
  std::ifstream in(moekit::config_dir() + "/qwen2-57b-a14b.json");
  cfg = nlohmann::json::parse(in);
  cfg["shared_expert_intermediate_size"] = 20000;  // not a multiple of 2560
  const MoeSpec s = moekit::parse_spec_json(cfg.dump(), "q2-odd");
  EXPECT_EQ(s.shared_slots(), 0);
  try {
    moekit::validate_spec(s, /*require_fusable=*/true);
    FAIL() << "no error";
  } catch (const moekit::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("shared width = 20000, expert intermediate size = 2560"));
  }
}

}  // namespace
