// Published checkpoint names per model family (see include/moekit/checkpoint.h for the table and
// its sources: the transformers modeling files of each family, MiniMax-M3's and DeepSeek-V4's
// published checkpoints as read by serving engines).
#include "io/checkpoint_names.h"

#include "moekit/error.h"

namespace moekit {

const char* checkpoint_naming_name(CheckpointNaming n) {
  switch (n) {
    case CheckpointNaming::Auto:
      return "auto";
    case CheckpointNaming::HfMlp:
      return "hf-mlp";
    case CheckpointNaming::Qwen2Moe:
      return "qwen2-moe";
    case CheckpointNaming::Mixtral:
      return "mixtral";
    case CheckpointNaming::MiniMax:
      return "minimax";
    case CheckpointNaming::DeepSeekV4:
      return "deepseek-v4";
    case CheckpointNaming::GptOss:
      return "gpt-oss";
  }
  return "?";
}

CheckpointNaming parse_checkpoint_naming(const std::string& s) {
  for (CheckpointNaming n :
       {CheckpointNaming::Auto, CheckpointNaming::HfMlp, CheckpointNaming::Qwen2Moe,
        CheckpointNaming::Mixtral, CheckpointNaming::MiniMax, CheckpointNaming::DeepSeekV4,
        CheckpointNaming::GptOss}) {
    if (s == checkpoint_naming_name(n)) return n;
  }
  MK_FAIL("unknown checkpoint naming '" << s
                                        << "' (expected auto, hf-mlp, qwen2-moe, mixtral, minimax, "
                                           "deepseek-v4 or gpt-oss)");
}

CheckpointNaming checkpoint_naming_for(const MoeSpec& spec) {
  const std::string& t = spec.model_type;
  if (t == "qwen2_moe") return CheckpointNaming::Qwen2Moe;
  if (t == "mixtral") return CheckpointNaming::Mixtral;
  if (t == "minimax_m2" || t == "minimax_m3" || t == "minimax_m3_vl" || t == "minimax")
    return CheckpointNaming::MiniMax;
  if (t == "deepseek_v4") return CheckpointNaming::DeepSeekV4;
  if (t == "gpt_oss") return CheckpointNaming::GptOss;
  // deepseek_v2/v3/v32, kimi_k2, glm4_moe, glm_moe_dsa, qwen3_moe and unknown families that
  // follow the transformers "mlp.experts.{e}.gate_proj" convention.
  return CheckpointNaming::HfMlp;
}

namespace io {

NameScheme name_scheme(CheckpointNaming naming, const std::string& block_in) {
  MK_CHECK(naming != CheckpointNaming::Auto, "name_scheme needs a concrete naming, got auto");
  NameScheme s;
  s.naming = naming;
  switch (naming) {
    case CheckpointNaming::Auto:
      break;
    case CheckpointNaming::HfMlp:
    case CheckpointNaming::Qwen2Moe: {
      const std::string b = block_in.empty() ? "mlp." : block_in;
      s.block = b;
      s.router = b + "gate.weight";
      s.correction_bias = b + "gate.e_score_correction_bias";
      s.expert_gate = b + "experts.{e}.gate_proj.weight";
      s.expert_up = b + "experts.{e}.up_proj.weight";
      s.expert_down = b + "experts.{e}.down_proj.weight";
      if (naming == CheckpointNaming::HfMlp) {
        s.shared_gate = b + "shared_experts.gate_proj.weight";
        s.shared_up = b + "shared_experts.up_proj.weight";
        s.shared_down = b + "shared_experts.down_proj.weight";
      } else {
        s.correction_bias.clear();
        s.shared_gate = b + "shared_expert.gate_proj.weight";
        s.shared_up = b + "shared_expert.up_proj.weight";
        s.shared_down = b + "shared_expert.down_proj.weight";
        s.shared_expert_gate = b + "shared_expert_gate.weight";
      }
      break;
    }
    case CheckpointNaming::Mixtral:
    case CheckpointNaming::MiniMax: {
      const std::string b = block_in.empty() ? "block_sparse_moe." : block_in;
      s.block = b;
      s.router = b + "gate.weight";
      s.expert_gate = b + "experts.{e}.w1.weight";
      s.expert_up = b + "experts.{e}.w3.weight";
      s.expert_down = b + "experts.{e}.w2.weight";
      if (naming == CheckpointNaming::MiniMax) {
        // MiniMax keeps the bias on the MoE block, not on the gate (DESIGN.md §1).
        s.correction_bias = b + "e_score_correction_bias";
        s.shared_gate = b + "shared_experts.gate_proj.weight";
        s.shared_up = b + "shared_experts.up_proj.weight";
        s.shared_down = b + "shared_experts.down_proj.weight";
      }
      break;
    }
    case CheckpointNaming::DeepSeekV4: {
      const std::string b = block_in.empty() ? "ffn." : block_in;
      s.block = b;
      s.router = b + "gate.weight";
      s.correction_bias = b + "gate.bias";
      s.expert_gate = b + "experts.{e}.w1.weight";
      s.expert_up = b + "experts.{e}.w3.weight";
      s.expert_down = b + "experts.{e}.w2.weight";
      s.shared_gate = b + "shared_experts.w1.weight";
      s.shared_up = b + "shared_experts.w3.weight";
      s.shared_down = b + "shared_experts.w2.weight";
      break;
    }
    case CheckpointNaming::GptOss: {
      const std::string b = block_in.empty() ? "mlp." : block_in;
      s.block = b;
      s.router = b + "router.weight";
      s.router_bias = b + "router.bias";
      s.stacked_gate_up = b + "experts.gate_up_proj";
      s.stacked_down = b + "experts.down_proj";
      s.stacked_gate_up_bias = b + "experts.gate_up_proj_bias";
      s.stacked_down_bias = b + "experts.down_proj_bias";
      s.interleaved = true;
      return s;
    }
  }
  s.stacked_gate_up = s.block + "experts.gate_up_proj";
  s.stacked_down = s.block + "experts.down_proj";
  return s;
}

std::vector<std::string> block_candidates(CheckpointNaming naming) {
  switch (naming) {
    case CheckpointNaming::Mixtral:
    case CheckpointNaming::MiniMax:
      return {"block_sparse_moe.", "mlp."};
    case CheckpointNaming::DeepSeekV4:
      return {"ffn."};
    default:
      return {"mlp."};
  }
}

const std::vector<std::string>& layer_prefix_candidates() {
  static const std::vector<std::string> kPrefixes = {
      "model.layers.{L}.", "language_model.model.layers.{L}.", "model.language_model.layers.{L}.",
      "layers.{L}."};
  return kPrefixes;
}

std::string default_layer_prefix(CheckpointNaming naming, const MoeSpec& spec) {
  if (naming == CheckpointNaming::DeepSeekV4) return "layers.{L}.";
  if (spec.model_type == "minimax_m3" || spec.model_type == "minimax_m3_vl")
    return "language_model.model.layers.{L}.";
  return "model.layers.{L}.";
}

std::string expand(const std::string& pattern, int layer, int expert) {
  std::string out;
  out.reserve(pattern.size() + 8);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern.compare(i, 3, "{L}") == 0) {
      out += std::to_string(layer);
      i += 2;
    } else if (pattern.compare(i, 3, "{e}") == 0) {
      MK_CHECK(expert >= 0, "pattern '" << pattern << "' needs an expert index");
      out += std::to_string(expert);
      i += 2;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

std::vector<std::string> scale_names(const std::string& weight_name) {
  std::vector<std::string> out = {weight_name + "_scale_inv"};
  const std::string suffix = ".weight";
  if (weight_name.size() > suffix.size() &&
      weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    out.push_back(weight_name.substr(0, weight_name.size() - suffix.size()) + ".scale");
  }
  return out;
}

std::vector<std::string> mx_scale_names(const std::string& weight_name) {
  std::vector<std::string> out = scale_names(weight_name);
  out.insert(out.begin() + 1, weight_name + "_scale");
  return out;
}

}  // namespace io

std::vector<std::string> checkpoint_tensor_names(const MoeSpec& spec, int layer,
                                                 CheckpointNaming naming, bool stacked) {
  if (naming == CheckpointNaming::Auto) naming = checkpoint_naming_for(spec);
  const io::NameScheme s = io::name_scheme(naming);
  const std::string p = io::expand(io::default_layer_prefix(naming, spec), layer);
  std::vector<std::string> names = {p + s.router};
  if (spec.has_correction_bias && !s.correction_bias.empty())
    names.push_back(p + s.correction_bias);
  if (spec.has_router_bias && !s.router_bias.empty()) names.push_back(p + s.router_bias);
  if (stacked || s.expert_gate.empty()) {
    names.push_back(p + s.stacked_gate_up);
    names.push_back(p + s.stacked_down);
    if (spec.has_expert_bias && !s.stacked_gate_up_bias.empty()) {
      names.push_back(p + s.stacked_gate_up_bias);
      names.push_back(p + s.stacked_down_bias);
    }
  } else {
    for (int e = 0; e < spec.num_experts; ++e) {
      for (const std::string* pat : {&s.expert_gate, &s.expert_up, &s.expert_down})
        names.push_back(p + io::expand(*pat, layer, e));
    }
  }
  if (spec.shared_kind != SharedKind::None) {
    MK_CHECK(!s.shared_gate.empty(), "naming " << checkpoint_naming_name(naming)
                                               << " has no shared-expert names, but spec "
                                               << spec.name << " has a shared expert");
    names.push_back(p + s.shared_gate);
    names.push_back(p + s.shared_up);
    names.push_back(p + s.shared_down);
    if (spec.shared_kind == SharedKind::Gated) {
      MK_CHECK(!s.shared_expert_gate.empty(), "naming " << checkpoint_naming_name(naming)
                                                        << " has no shared-expert gate, but spec "
                                                        << spec.name
                                                        << " has a gated shared expert");
      names.push_back(p + s.shared_expert_gate);
    }
  }
  return names;
}

}  // namespace moekit
