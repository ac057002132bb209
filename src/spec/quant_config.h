// config.json's quantization_config -> QuantSpec (spec.h), as transformers reads it: the
// quant_method picks the config class (FineGrainedFP8Config for "fp8", Mxfp4Config for "mxfp4"),
// a key the file omits takes that class's default (weight_block_size [128, 128],
// activation_scheme "dynamic"), and what moekit cannot run is an error naming the key and value.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "moekit/spec.h"

namespace moekit::spec_internal {

// Reads top["quantization_config"] (or, for VL wrappers, text["quantization_config"]); kind None
// when neither holds one. `config_name` names the config in errors.
QuantSpec parse_quant_config(const nlohmann::json& top, const nlohmann::json& text,
                             const std::string& config_name);

}  // namespace moekit::spec_internal
