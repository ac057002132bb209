// Per-model_type defaults and fixed semantics of transformers 5.x (transformers_defaults.h).
//
// The default tables are the class defaults of each family's transformers config class
// (configuration_<type>.py), for the keys spec.cpp reads; tests/configs_hf/class_defaults.json,
// written by transformers itself, must agree with them (test_spec_hf.cpp). The semantics are
// those of each family's router and decoder layer in modeling_<type>.py.
#include "spec/transformers_defaults.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "moekit/error.h"

namespace moekit::spec_internal {
namespace {

using nlohmann::json;

// DeepseekV3Config; Kimi-K2 (architecture DeepseekV3ForCausalLM, no transformers class of its
// own) takes the same defaults.
constexpr const char* kDeepseekV3 = R"({
  "hidden_size": 7168, "num_hidden_layers": 61, "n_routed_experts": 256, "num_experts_per_tok": 8,
  "moe_intermediate_size": 2048, "intermediate_size": 18432, "n_shared_experts": 1,
  "n_group": 8, "topk_group": 4, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
  "first_k_dense_replace": 3, "hidden_act": "silu"})";

struct Family {
  const char* model_type;
  const char* defaults;  // JSON object
};

const Family kFamilies[] = {
    {"deepseek_v2", R"({
      "hidden_size": 4096, "num_hidden_layers": 32, "n_routed_experts": 64,
      "num_experts_per_tok": null, "moe_intermediate_size": 1407, "intermediate_size": 11008,
      "n_shared_experts": 2, "n_group": null, "topk_group": null, "topk_method": "greedy",
      "norm_topk_prob": false, "routed_scaling_factor": 1.0, "first_k_dense_replace": 0,
      "hidden_act": "silu"})"},
    {"deepseek_v3", kDeepseekV3},
    {"deepseek_v32", kDeepseekV3},
    // num_hash_layers is not a field of DeepseekV4Config: the class folds a legacy value into
    // mlp_layer_types and otherwise makes the first default_num_hash_layers = 3 layers hash_moe.
    {"deepseek_v4", R"({
      "hidden_size": 4096, "num_hidden_layers": 43, "n_routed_experts": 256,
      "num_experts_per_tok": 6, "moe_intermediate_size": 2048, "n_shared_experts": 1,
      "scoring_func": "sqrtsoftplus", "norm_topk_prob": true, "routed_scaling_factor": 1.5,
      "hidden_act": "silu", "swiglu_limit": 10.0, "num_hash_layers": 3})"},
    {"glm4_moe", R"({
      "hidden_size": 4096, "num_hidden_layers": 46, "n_routed_experts": 128,
      "num_experts_per_tok": 8, "moe_intermediate_size": 1408, "intermediate_size": 10944,
      "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": true,
      "routed_scaling_factor": 1.0, "first_k_dense_replace": 1, "hidden_act": "silu"})"},
    {"glm_moe_dsa", R"({
      "hidden_size": 6144, "num_hidden_layers": 78, "n_routed_experts": 256,
      "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "intermediate_size": 12288,
      "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": true,
      "routed_scaling_factor": 2.5, "first_k_dense_replace": 3, "hidden_act": "silu"})"},
    {"gpt_oss", R"({
      "hidden_size": 2880, "num_hidden_layers": 36, "num_local_experts": 128,
      "num_experts_per_tok": 4, "intermediate_size": 2880, "hidden_act": "silu",
      "swiglu_limit": 7.0, "swiglu_alpha": 1.702})"},
    {"kimi_k2", kDeepseekV3},
    {"minimax_m2", R"({
      "hidden_size": 3072, "num_hidden_layers": 62, "num_local_experts": 256,
      "num_experts_per_tok": 8, "intermediate_size": 1536, "hidden_act": "silu"})"},
    // MiniMaxM3VLTextConfig (the text_config of MiniMaxM3VLConfig).
    {"minimax_m3", R"({
      "hidden_size": 6144, "num_hidden_layers": 60, "num_local_experts": 128,
      "num_experts_per_tok": 4, "intermediate_size": 3072, "shared_intermediate_size": 3072,
      "routed_scaling_factor": 2.0, "hidden_act": "silu", "swiglu_limit": 7.0,
      "swiglu_alpha": 1.702})"},
    {"mixtral", R"({
      "hidden_size": 4096, "num_hidden_layers": 32, "num_local_experts": 8,
      "num_experts_per_tok": 2, "intermediate_size": 14336, "hidden_act": "silu"})"},
    {"qwen2_moe", R"({
      "hidden_size": 2048, "num_hidden_layers": 24, "num_experts": 60, "num_experts_per_tok": 4,
      "moe_intermediate_size": 1408, "intermediate_size": 5632,
      "shared_expert_intermediate_size": 5632, "norm_topk_prob": false,
      "decoder_sparse_step": 1, "mlp_only_layers": [], "hidden_act": "silu"})"},
    {"qwen3_moe", R"({
      "hidden_size": 2048, "num_hidden_layers": 24, "num_local_experts": 128,
      "num_experts_per_tok": 8, "moe_intermediate_size": 768, "intermediate_size": 6144,
      "norm_topk_prob": false, "decoder_sparse_step": 1, "mlp_only_layers": [],
      "hidden_act": "silu"})"},
};

const std::map<std::string, json>& defaults_by_type() {
  static const std::map<std::string, json> table = [] {
    std::map<std::string, json> t;
    for (const Family& f : kFamilies) t.emplace(f.model_type, json::parse(f.defaults));
    return t;
  }();
  return table;
}

// Keys that name the same quantity; a default is added only when none of its group is present.
const std::vector<std::vector<std::string>> kAliasGroups = {
    {"n_routed_experts", "num_experts", "num_local_experts"},
    {"num_experts_per_tok", "experts_per_token"},
};

bool present(const json& obj, const std::string& key) {
  return obj.contains(key) && !obj.at(key).is_null();
}

bool one_of(const std::string& v, std::initializer_list<const char*> set) {
  return std::any_of(set.begin(), set.end(), [&](const char* s) { return v == s; });
}

// Families whose decoder layer picks dense or MoE from config.mlp_layer_types.
bool reads_mlp_layer_types(const std::string& t) {
  return one_of(t, {"deepseek_v32", "glm_moe_dsa", "deepseek_v4", "minimax_m3"});
}

// MoE layers (and DeepSeek-V4's hash-routed prefix) from an mlp_layer_types list. transformers
// reads entry layer_idx for each of the num_hidden_layers layers, so a longer list is cut.
void layers_from_mlp_layer_types(MoeSpec& s, const json& types, const std::string& name) {
  MK_CHECK(types.is_array(),
           "config '" << name << "': 'mlp_layer_types' must be a list, got " << types.dump());
  MK_CHECK(static_cast<int>(types.size()) >= s.num_layers,
           "config '" << name << "': 'mlp_layer_types' has " << types.size()
                      << " entries, expected num_hidden_layers = " << s.num_layers);
  const bool v4 = s.model_type == "deepseek_v4";
  std::vector<int> layers;
  int hash_layers = 0;
  for (int i = 0; i < s.num_layers; ++i) {
    const json& v = types[i];
    const std::string t = v.is_string() ? v.get<std::string>() : "";
    if (v4) {
      MK_CHECK(t == "moe" || t == "hash_moe", "config '" << name << "': 'mlp_layer_types'[" << i
                                                         << "] = " << v.dump()
                                                         << " (expected \"moe\" or \"hash_moe\")");
      if (t == "hash_moe") {
        MK_CHECK(hash_layers == static_cast<int>(layers.size()),
                 "config '" << name << "': 'mlp_layer_types'[" << i
                            << "] is \"hash_moe\" after a score-routed layer; moekit needs the "
                               "hash-routed layers first");
        ++hash_layers;
      }
      layers.push_back(i);
    } else {
      MK_CHECK(t == "sparse" || t == "dense", "config '" << name << "': 'mlp_layer_types'[" << i
                                                         << "] = " << v.dump()
                                                         << " (expected \"sparse\" or \"dense\")");
      if (t == "sparse") layers.push_back(i);
    }
  }
  s.moe_layers = std::move(layers);
  if (v4) s.num_hash_layers = hash_layers;
}

}  // namespace

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> types = [] {
    std::vector<std::string> v;
    for (const auto& kv : defaults_by_type()) v.push_back(kv.first);
    return v;  // std::map keeps them sorted
  }();
  return types;
}

std::string supported_model_types_text() {
  std::ostringstream os;
  const auto& types = supported_model_types();
  for (size_t i = 0; i < types.size(); ++i) os << (i ? ", " : "") << types[i];
  return os.str();
}

bool is_supported_model_type(const std::string& model_type) {
  return defaults_by_type().count(model_type) != 0;
}

std::string canonical_model_type(const json& top, const json& text) {
  for (const json* obj : {&text, &top}) {
    if (obj->contains("architectures") && (*obj)["architectures"].is_array()) {
      for (const json& a : (*obj)["architectures"]) {
        if (a.is_string() && a.get<std::string>().rfind("MiniMaxM3", 0) == 0) return "minimax_m3";
      }
    }
  }
  for (const json* obj : {&text, &top}) {
    if (obj->contains("model_type") && (*obj)["model_type"].is_string()) {
      const std::string t = (*obj)["model_type"].get<std::string>();
      if (t == "minimax_m3_vl" || t == "minimax_m3_vl_text") return "minimax_m3";
      return t;
    }
  }
  return "";
}

const json& transformers_defaults(const std::string& model_type) {
  const auto it = defaults_by_type().find(model_type);
  MK_CHECK(it != defaults_by_type().end(),
           "unsupported model_type '" << model_type
                                      << "' (supported: " << supported_model_types_text() << ")");
  return it->second;
}

json with_transformers_defaults(const json& text, const std::string& model_type) {
  json out = text;
  for (const auto& [key, value] : transformers_defaults(model_type).items()) {
    if (value.is_null() || out.contains(key)) continue;
    bool alias_present = false;
    for (const auto& group : kAliasGroups) {
      if (std::find(group.begin(), group.end(), key) == group.end()) continue;
      for (const std::string& k : group) alias_present = alias_present || present(text, k);
    }
    if (!alias_present) out[key] = value;
  }
  return out;
}

void apply_transformers_semantics(MoeSpec& s, const json& text, const std::string& name) {
  const std::string& t = s.model_type;
  // Routers: DeepseekV3TopkRouter and its copies (V3.2, GLM-4.5, GLM-5) always take sigmoid
  // scores, select on score + e_score_correction_bias and score groups by their top-2 sum;
  // topk_method and scoring_func are not read.
  if (one_of(t, {"deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe", "glm_moe_dsa"})) {
    s.scoring = Scoring::Sigmoid;
    s.has_correction_bias = true;
    s.group_score_top2_sum = true;
  } else if (t == "deepseek_v2") {
    // DeepseekV2TopkRouter: softmax scores, group max (group_limited_greedy), no bias.
    s.scoring = Scoring::Softmax;
    s.has_correction_bias = false;
    s.group_score_top2_sum = false;
  } else if (t == "deepseek_v4") {
    // DeepseekV4TopKRouter: scoring_func, always the bias, no groups, always renormalised.
    s.has_correction_bias = true;
    s.group_score_top2_sum = false;
    s.n_group = s.topk_group = 1;
    s.renormalize = true;
  } else if (t == "minimax_m2" || t == "minimax_m3") {
    // MiniMaxM2TopKRouter / MiniMaxM3VLTopKRouter: sigmoid, always the bias, no groups,
    // always renormalised; use_routing_bias and scoring_func are not read.
    s.scoring = Scoring::Sigmoid;
    s.has_correction_bias = true;
    s.group_score_top2_sum = false;
    s.n_group = s.topk_group = 1;
    s.renormalize = true;
    // MiniMax-M3's experts and shared MLP compute the clamped swigluoai inline from
    // swiglu_alpha / swiglu_limit; the class resets hidden_act to "silu".
    if (t == "minimax_m3") s.activation = Activation::SwigluOai;
  } else if (t == "mixtral") {
    // MixtralTopKRouter renormalises always; norm_topk_prob is not read.
    s.scoring = Scoring::Softmax;
    s.has_correction_bias = false;
    s.n_group = s.topk_group = 1;
    s.renormalize = true;
  } else if (t == "qwen2_moe" || t == "qwen3_moe") {
    s.scoring = Scoring::Softmax;
    s.has_correction_bias = false;
    s.n_group = s.topk_group = 1;
  } else if (t == "gpt_oss") {
    s.n_group = s.topk_group = 1;
    s.has_correction_bias = false;
  }
  if (reads_mlp_layer_types(t) && present(text, "mlp_layer_types"))
    layers_from_mlp_layer_types(s, text.at("mlp_layer_types"), name);
}

}  // namespace moekit::spec_internal

namespace moekit {
std::vector<std::string> supported_model_types() { return spec_internal::supported_model_types(); }
}  // namespace moekit
