// The model families moekit reads as transformers 5.x reads them: per model_type, the default of
// every config key moekit uses (the value the family's transformers config class gives a key the
// file omits) and the routing / activation / layer semantics that the family's transformers
// modeling code fixes whatever the file says. spec.cpp parses a config through these; the
// fixtures under tests/configs_hf (scripts/golden/make_hf_configs.py) pin the tables to
// transformers.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moekit/spec.h"

namespace moekit::spec_internal {

// The model_types moekit supports, sorted ("deepseek_v2", ..., "qwen3_moe").
const std::vector<std::string>& supported_model_types();
// "deepseek_v2, deepseek_v3, ...": for error messages.
std::string supported_model_types_text();
bool is_supported_model_type(const std::string& model_type);

// The family moekit calls a config: its model_type, with MiniMax-M3's spellings
// ("minimax_m3_vl", "minimax_m3_vl_text", or a MiniMaxM3* architecture without a model_type)
// mapped to "minimax_m3". Empty when the config names neither.
std::string canonical_model_type(const nlohmann::json& top, const nlohmann::json& text);

// The transformers class defaults of the keys moekit reads for `model_type` (null where the
// class default is None). Throws moekit::Error for an unsupported model_type.
const nlohmann::json& transformers_defaults(const std::string& model_type);

// `text` with every key of transformers_defaults(model_type) that it lacks added. Null defaults
// are not added; an expert-count or top-k default is added only when no alias of it is present.
nlohmann::json with_transformers_defaults(const nlohmann::json& text,
                                          const std::string& model_type);

// Applies what the family's transformers modeling code fixes regardless of the config (e.g.
// DeepSeek-V3: sigmoid scores, e_score_correction_bias, top-2-sum group scores) and the MoE
// layers of an `mlp_layer_types` list for the families whose decoder layer reads one. `text` is
// the config after with_transformers_defaults; `config_name` names it in errors.
void apply_transformers_semantics(MoeSpec& s, const nlohmann::json& text,
                                  const std::string& config_name);

}  // namespace moekit::spec_internal
