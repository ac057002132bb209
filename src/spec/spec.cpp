// config.json -> MoeSpec for every family of DESIGN.md §5.
//
// Families differ in key names (n_routed_experts / num_experts / num_local_experts, ...), in which
// layers are MoE (first_k_dense_replace, decoder_sparse_step + mlp_only_layers, a moe_layer_freq
// list, or every layer) and in defaults that their modeling code fixes rather than the config
// (MiniMax's fp32 router, gpt-oss's clamped swiglu). This file reads them into one struct; every
// error names the config, the key and the value. validate_spec, the checks every spec passes, is
// here too; the names and the sizes derived from a spec are spec_derived.cpp's, and finding a
// config file by name or path is spec_files.cpp's.
#include <algorithm>
#include <climits>
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/json_safe.h"
#include "moekit/error.h"
#include "moekit/spec.h"
#include "spec/quant_config.h"
#include "spec/transformers_defaults.h"

namespace moekit {
namespace {

using nlohmann::json;

// Reads keys of one config object and names the config in every error.
class ConfigReader {
 public:
  ConfigReader(const json& obj, std::string name) : obj_(obj), name_(std::move(name)) {}

  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }

  long long integer(const char* key) const {
    MK_CHECK(has(key), "config '" << name_ << "': missing key '" << key << "'");
    return integer_value(key, obj_.at(key));
  }
  long long integer_or(const char* key, long long fallback) const {
    return has(key) ? integer_value(key, obj_.at(key)) : fallback;
  }
  double number_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = obj_.at(key);
    MK_CHECK(v.is_number(), "config '" << name_ << "': key '" << key << "' must be a number, got "
                                       << describe_json(v));
    return v.get<double>();
  }
  // A number stored as float: beyond float's range (1e300) it would become infinity.
  float float_or(const char* key, double fallback) const {
    const double v = number_or(key, fallback);
    MK_CHECK(std::isfinite(v) && std::fabs(v) <= 3.4028234663852886e38,
             "config '" << name_ << "': key '" << key << "' = " << v
                        << " is outside the range of a 32-bit float");
    return static_cast<float>(v);
  }
  // An integer stored as int: 2^32 + 1 must not become 1.
  int int_or(const char* key, long long fallback) const {
    const long long v = integer_or(key, fallback);
    MK_CHECK(v >= INT_MIN && v <= INT_MAX, "config '" << name_ << "': key '" << key << "' = " << v
                                                      << " does not fit in a 32-bit int");
    return static_cast<int>(v);
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = obj_.at(key);
    MK_CHECK(v.is_boolean(), "config '" << name_ << "': key '" << key
                                        << "' must be true or false, got " << describe_json(v));
    return v.get<bool>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = obj_.at(key);
    MK_CHECK(v.is_string(), "config '" << name_ << "': key '" << key << "' must be a string, got "
                                       << describe_json(v));
    return v.get<std::string>();
  }
  // The first of several alternative keys that is present; error lists them all.
  const char* first_of(std::initializer_list<const char*> keys) const {
    for (const char* k : keys)
      if (has(k)) return k;
    std::ostringstream os;
    bool first = true;
    for (const char* k : keys) {
      os << (first ? "" : " or ") << "'" << k << "'";
      first = false;
    }
    MK_FAIL("config '" << name_ << "': missing key " << os.str());
  }
  const json& at(const char* key) const { return obj_.at(key); }
  const std::string& name() const { return name_; }

 private:
  long long integer_value(const char* key, const json& v) const {
    MK_CHECK(v.is_number_integer(), "config '" << name_ << "': key '" << key
                                               << "' must be an integer, got " << describe_json(v));
    const std::optional<long long> i = json_as_int64(v);
    MK_CHECK(i.has_value(), "config '" << name_ << "': key '" << key << "' = " << describe_json(v)
                                       << " does not fit in a 64-bit integer");
    return *i;
  }

  const json& obj_;
  std::string name_;
};

constexpr int kMaxLayers = 1 << 16;

// Integer that must fit an int and be > 0.
int positive(const ConfigReader& c, const char* key, long long v) {
  MK_CHECK(v > 0 && v <= (1LL << 30),
           "config '" << c.name() << "': '" << key << "' must be a positive size, got " << v);
  return static_cast<int>(v);
}

bool is_deepseek_like(const std::string& f) {
  return f == "deepseek_v2" || f == "deepseek_v3" || f == "deepseek_v32" || f == "kimi_k2" ||
         f == "glm4_moe" || f == "glm_moe_dsa" || f == "deepseek_v4";
}

// Which decoder layers hold an MoE block, per family convention.
std::vector<int> moe_layer_indices(const ConfigReader& c, const std::string& family,
                                   int num_layers) {
  std::vector<int> layers;
  if (c.has("moe_layer_freq") && c.at("moe_layer_freq").is_array()) {
    // MiniMax-M3: a per-layer 0/1 list.
    const json& freq = c.at("moe_layer_freq");
    MK_CHECK(static_cast<int>(freq.size()) == num_layers,
             "config '" << c.name() << "': 'moe_layer_freq' has " << freq.size()
                        << " entries, expected num_hidden_layers = " << num_layers);
    for (int i = 0; i < num_layers; ++i) {
      const std::optional<int> f = json_as_int(freq[i]);
      MK_CHECK(f.has_value(), "config '" << c.name() << "': 'moe_layer_freq'[" << i
                                         << "] must be 0 or 1, got " << describe_json(freq[i]));
      if (*f != 0) layers.push_back(i);
    }
    return layers;
  }
  if (c.has("first_k_dense_replace") || is_deepseek_like(family)) {
    // DeepSeek family: layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0.
    const long long first_dense = c.integer_or("first_k_dense_replace", 0);
    const long long freq = c.integer_or("moe_layer_freq", 1);
    MK_CHECK(first_dense >= 0 && first_dense <= num_layers,
             "config '" << c.name() << "': 'first_k_dense_replace' = " << first_dense
                        << " outside [0, num_hidden_layers = " << num_layers << "]");
    MK_CHECK(freq >= 1, "config '" << c.name() << "': 'moe_layer_freq' must be >= 1, got " << freq);
    for (int i = 0; i < num_layers; ++i)
      if (i >= first_dense && i % freq == 0) layers.push_back(i);
    return layers;
  }
  if (c.has("decoder_sparse_step") || c.has("mlp_only_layers")) {
    // Qwen2/3-MoE: MoE unless listed in mlp_only_layers, every decoder_sparse_step-th layer.
    const long long step = c.integer_or("decoder_sparse_step", 1);
    MK_CHECK(step >= 1,
             "config '" << c.name() << "': 'decoder_sparse_step' must be >= 1, got " << step);
    std::vector<int> dense_only;
    if (c.has("mlp_only_layers")) {
      MK_CHECK(c.at("mlp_only_layers").is_array(),
               "config '" << c.name() << "': 'mlp_only_layers' must be a list");
      for (const json& v : c.at("mlp_only_layers")) {
        const std::optional<int> layer = json_as_int(v);
        MK_CHECK(layer.has_value(), "config '" << c.name()
                                               << "': 'mlp_only_layers' holds a non-integer "
                                               << describe_json(v));
        dense_only.push_back(*layer);
      }
    }
    for (int i = 0; i < num_layers; ++i) {
      const bool dense = std::find(dense_only.begin(), dense_only.end(), i) != dense_only.end();
      if (!dense && (i + 1) % step == 0) layers.push_back(i);
    }
    return layers;
  }
  // Mixtral, gpt-oss, MiniMax-M2: every layer is MoE.
  for (int i = 0; i < num_layers; ++i) layers.push_back(i);
  return layers;
}

Scoring scoring_of(const ConfigReader& c, const std::string& family) {
  if (family == "gpt_oss") return Scoring::SoftmaxOfTopk;
  std::string fallback = "softmax";
  if (family == "deepseek_v3" || family == "deepseek_v32" || family == "kimi_k2" ||
      family == "glm4_moe" || family == "glm_moe_dsa" || family == "minimax_m2" ||
      family == "minimax_m3")
    fallback = "sigmoid";
  if (family == "deepseek_v4") fallback = "sqrtsoftplus";
  const std::string s = c.string_or("scoring_func", fallback);
  if (s == "softmax") return Scoring::Softmax;
  if (s == "sigmoid") return Scoring::Sigmoid;
  if (s == "sqrtsoftplus") return Scoring::SqrtSoftplus;
  MK_FAIL("config '" << c.name() << "': unknown 'scoring_func' = '" << s
                     << "' (expected softmax, sigmoid or sqrtsoftplus)");
}

}  // namespace

MoeSpec parse_spec_json(const std::string& json_text, const std::string& name,
                        const SpecOptions& options) {
  const json top = parse_json_bounded(json_text, "config '" + name + "'");
  MK_CHECK(top.is_object(), "config '" << name << "' must be a JSON object, got " << top.type_name());
  // VL wrappers (MiniMax-M3) keep the language model's keys under text_config.
  const bool nested = top.contains("text_config") && top["text_config"].is_object();
  const json& file_text = nested ? top["text_config"] : top;

  MoeSpec s;
  s.name = name;
  s.model_type = spec_internal::canonical_model_type(top, file_text);
  MK_CHECK(!s.model_type.empty(),
           "config '" << name << "': missing key 'model_type' (and no known 'architectures')");
  const bool supported = spec_internal::is_supported_model_type(s.model_type);
  MK_CHECK(supported || options.allow_generic_moe,
           "config '" << name << "': unsupported model_type '" << s.model_type
                      << "' (supported: " << spec_internal::supported_model_types_text()
                      << "); SpecOptions::allow_generic_moe reads it as a generic top-k MoE");
  // Keys the file omits take the transformers class defaults of a supported family.
  const json text = supported ? spec_internal::with_transformers_defaults(file_text, s.model_type)
                              : file_text;
  const ConfigReader c(text, nested ? name + ":text_config" : name);

  s.hidden = positive(c, "hidden_size", c.integer("hidden_size"));
  s.num_layers = positive(c, "num_hidden_layers", c.integer("num_hidden_layers"));
  // The layer list is materialised (moe_layers), so a corrupt count must not allocate gigabytes;
  // published models have at most a few hundred layers.
  MK_CHECK(s.num_layers <= kMaxLayers, "config '" << c.name() << "': 'num_hidden_layers' = "
                                                  << s.num_layers << " exceeds " << kMaxLayers);
  const char* experts_key = c.first_of({"n_routed_experts", "num_experts", "num_local_experts"});
  s.num_experts = positive(c, experts_key, c.integer(experts_key));
  const char* topk_key = c.first_of({"num_experts_per_tok", "experts_per_token"});
  s.top_k = positive(c, topk_key, c.integer(topk_key));
  const char* inter_key = c.first_of({"moe_intermediate_size", "intermediate_size"});
  s.expert_intermediate = positive(c, inter_key, c.integer(inter_key));

  // Routing.
  s.scoring = scoring_of(c, s.model_type);
  const std::string topk_method = c.string_or("topk_method", "");
  s.has_correction_bias = topk_method == "noaux_tc" || c.boolean_or("use_routing_bias", false) ||
                          s.model_type == "glm4_moe" || s.model_type == "glm_moe_dsa";
  s.n_group = c.int_or("n_group", 1);
  s.topk_group = c.int_or("topk_group", 1);
  if (s.model_type == "deepseek_v2" && topk_method != "group_limited_greedy") {
    // DeepSeek-V2 "greedy" ignores the groups its config still lists.
    s.n_group = 1;
    s.topk_group = 1;
  }
  s.group_score_top2_sum = s.has_correction_bias;
  if (s.model_type == "mixtral" || s.model_type == "minimax_m2" || s.model_type == "minimax_m3")
    s.renormalize = c.boolean_or("norm_topk_prob", true);
  else
    s.renormalize = c.boolean_or("norm_topk_prob", false);
  s.routed_scaling_factor = c.float_or("routed_scaling_factor", 1.0);
  s.has_router_bias = s.model_type == "gpt_oss";
  s.router_dtype = DType::BF16;
  if (s.model_type == "minimax_m2" || s.model_type == "minimax_m3" ||
      s.model_type == "deepseek_v4")
    s.router_dtype = DType::F32;  // the gate is kept in fp32 by the model's code and checkpoint
  const std::string router_dtype = c.string_or("router_dtype", "");
  if (!router_dtype.empty()) {
    if (router_dtype == "float32" || router_dtype == "fp32")
      s.router_dtype = DType::F32;
    else if (router_dtype == "bfloat16" || router_dtype == "bf16")
      s.router_dtype = DType::BF16;
    else
      MK_FAIL("config '" << c.name() << "': unknown 'router_dtype' = '" << router_dtype
                         << "' (expected float32 or bfloat16)");
  }

  // Experts.
  const std::string act = c.string_or("hidden_act", "silu");
  s.swiglu_limit = c.float_or("swiglu_limit", 0.0);
  s.swiglu_alpha = c.float_or("swiglu_alpha", 1.702);
  s.swiglu_beta = c.float_or("swiglu_beta", 1.0);
  if (s.model_type == "gpt_oss") {
    s.activation = Activation::SwigluOaiInterleaved;
    if (s.swiglu_limit == 0.0f) s.swiglu_limit = 7.0f;
    s.has_expert_bias = true;
  } else if (act == "swigluoai") {
    s.activation = Activation::SwigluOai;
  } else if (act == "silu" || act == "swiglu") {
    s.activation = Activation::Silu;
  } else {
    MK_FAIL("config '" << c.name() << "': unsupported 'hidden_act' = '" << act
                       << "' (expected silu or swigluoai)");
  }

  // Shared expert.
  if (c.integer_or("shared_expert_intermediate_size", 0) > 0) {
    s.shared_kind = SharedKind::Gated;  // Qwen2-MoE
    s.shared_intermediate = positive(c, "shared_expert_intermediate_size",
                                     c.integer("shared_expert_intermediate_size"));
  } else if (c.integer_or("shared_intermediate_size", 0) > 0) {
    s.shared_kind = SharedKind::Plain;  // MiniMax-M3: the shared MLP's whole width
    s.shared_intermediate =
        positive(c, "shared_intermediate_size", c.integer("shared_intermediate_size"));
  } else if (c.integer_or("n_shared_experts", 0) > 0) {
    s.shared_kind = SharedKind::Plain;  // DeepSeek family: n_shared_experts * I
    const int n_shared = positive(c, "n_shared_experts", c.integer("n_shared_experts"));
    // In 64 bits: both factors may be up to 2^30, and an int product would overflow.
    s.shared_intermediate = positive(c, "n_shared_experts * moe_intermediate_size",
                                     static_cast<long long>(n_shared) * s.expert_intermediate);
  } else {
    MK_CHECK(c.integer_or("n_shared_experts", 0) >= 0 &&
                 c.integer_or("shared_intermediate_size", 0) >= 0 &&
                 c.integer_or("shared_expert_intermediate_size", 0) >= 0,
             "config '" << c.name() << "': shared expert sizes must not be negative");
  }

  s.num_hash_layers = c.int_or("num_hash_layers", 0);
  s.moe_layers = moe_layer_indices(c, s.model_type, s.num_layers);
  s.quant = spec_internal::parse_quant_config(top, file_text, name);
  if (supported) spec_internal::apply_transformers_semantics(s, text, c.name());
  validate_spec(s);
  return s;
}

void validate_spec(const MoeSpec& s, bool require_fusable) {
  const std::string& n = s.name;
  MK_CHECK(s.hidden > 0, "config '" << n << "': hidden_size must be > 0, got " << s.hidden);
  MK_CHECK(s.num_experts > 0, "config '" << n << "': number of experts must be > 0, got "
                                         << s.num_experts);
  MK_CHECK(s.expert_intermediate > 0, "config '" << n << "': expert intermediate size must be > 0, got "
                                                 << s.expert_intermediate);
  MK_CHECK(s.top_k >= 1 && s.top_k <= s.num_experts,
           "config '" << n << "': num_experts_per_tok = " << s.top_k
                      << " must be in [1, number of experts = " << s.num_experts << "]");
  MK_CHECK(s.n_group >= 1, "config '" << n << "': n_group must be >= 1, got " << s.n_group);
  MK_CHECK(s.num_experts % s.n_group == 0,
           "config '" << n << "': number of experts = " << s.num_experts
                      << " is not divisible by n_group = " << s.n_group);
  MK_CHECK(s.topk_group >= 1 && s.topk_group <= s.n_group,
           "config '" << n << "': topk_group = " << s.topk_group << " must be in [1, n_group = "
                      << s.n_group << "]");
  if (s.n_group > 1) {
    const int per_group = s.num_experts / s.n_group;
    MK_CHECK(s.top_k <= s.topk_group * per_group,
             "config '" << n << "': num_experts_per_tok = " << s.top_k << " exceeds the "
                        << s.topk_group * per_group << " experts of the topk_group = "
                        << s.topk_group << " groups kept");
    // The top-2-sum group score needs two experts per group.
    MK_CHECK(!s.group_score_top2_sum || per_group >= 2,
             "config '" << n << "': n_group = " << s.n_group << " leaves " << per_group
                        << " expert per group; the biased group score needs at least 2");
  }
  MK_CHECK(std::isfinite(s.routed_scaling_factor) && s.routed_scaling_factor > 0.0f,
           "config '" << n << "': routed_scaling_factor must be a positive number, got "
                      << s.routed_scaling_factor);
  MK_CHECK(std::isfinite(s.swiglu_limit) && s.swiglu_limit >= 0.0f,
           "config '" << n << "': swiglu_limit must be >= 0, got " << s.swiglu_limit);
  MK_CHECK(std::isfinite(s.swiglu_alpha) && std::isfinite(s.swiglu_beta),
           "config '" << n << "': swiglu_alpha and swiglu_beta must be finite, got "
                      << s.swiglu_alpha << " and " << s.swiglu_beta);
  MK_CHECK(s.num_layers > 0, "config '" << n << "': num_hidden_layers must be > 0, got "
                                        << s.num_layers);
  MK_CHECK(!s.moe_layers.empty(), "config '" << n << "': no layer of the " << s.num_layers
                                             << " is an MoE layer");
  MK_CHECK(s.shared_kind == SharedKind::None || s.shared_intermediate > 0,
           "config '" << n << "': shared expert width must be > 0, got " << s.shared_intermediate);
  MK_CHECK(s.num_hash_layers >= 0 && s.num_hash_layers <= s.num_layers,
           "config '" << n << "': num_hash_layers = " << s.num_hash_layers << " outside [0, "
                      << s.num_layers << "]");
  // Weight rows E + S and slots k + S are ints everywhere; keep them far from overflow.
  MK_CHECK(static_cast<long long>(s.num_experts) + s.shared_slots() <= (1LL << 30),
           "config '" << n << "': number of experts (" << s.num_experts << ") + shared slots ("
                      << s.shared_slots() << ") exceeds 2^30");
  if (require_fusable) {
    MK_CHECK(s.shared_kind != SharedKind::None,
             "config '" << n << "': shared-expert fusion asked for, but the model has no shared expert");
    MK_CHECK(s.shared_intermediate % s.expert_intermediate == 0,
             "config '" << n << "': shared-expert fusion needs the shared width to be a multiple of "
                        << "the expert width; shared width = " << s.shared_intermediate
                        << ", expert intermediate size = " << s.expert_intermediate);
  }
}

}  // namespace moekit
