// spec_from_json's cache and the spec's summary for Python.
#include "spec_cache.h"

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

namespace moekit::torch_ops {

const MoeSpec& spec_from_json(const std::string& config_json) {
  // why: an op call parses nothing after the first call with a given text (a layer's every call
  // passes the same string); specs are never evicted, a model has one or a few.
  static std::mutex mutex;
  static std::unordered_map<std::string, std::unique_ptr<MoeSpec>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(config_json);
  if (it != cache.end()) return *it->second;
  auto spec = std::make_unique<MoeSpec>(parse_spec_json(config_json, "the spec argument"));
  validate_spec(*spec);
  return *cache.emplace(config_json, std::move(spec)).first->second;
}

std::string spec_summary_json(const MoeSpec& s) {
  nlohmann::json j;
  j["name"] = s.name;
  j["model_type"] = s.model_type;
  j["hidden"] = s.hidden;
  j["num_experts"] = s.num_experts;
  j["top_k"] = s.top_k;
  j["expert_intermediate"] = s.expert_intermediate;
  j["num_layers"] = s.num_layers;
  j["moe_layers"] = s.moe_layers;
  j["scoring"] = scoring_name(s.scoring);
  j["has_correction_bias"] = s.has_correction_bias;
  j["n_group"] = s.n_group;
  j["topk_group"] = s.topk_group;
  j["renormalize"] = s.renormalize;
  j["routed_scaling_factor"] = s.routed_scaling_factor;
  j["router_dtype"] = dtype_name(s.router_dtype);
  j["has_router_bias"] = s.has_router_bias;
  j["activation"] = activation_name(s.activation);
  j["swiglu_limit"] = s.swiglu_limit;
  j["swiglu_alpha"] = s.swiglu_alpha;
  j["swiglu_beta"] = s.swiglu_beta;
  j["has_expert_bias"] = s.has_expert_bias;
  j["shared_kind"] = shared_kind_name(s.shared_kind);
  j["shared_intermediate"] = s.shared_intermediate;
  j["shared_slots"] = s.shared_slots();
  j["router_columns"] = s.router_columns();
  return j.dump();
}

}  // namespace moekit::torch_ops
