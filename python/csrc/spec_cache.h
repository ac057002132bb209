// The MoeSpec an op's `spec` argument names: config.json text, parsed once per distinct text
// (the ops take the text so that a schema of plain types carries every field of the spec).
#pragma once

#include <string>

#include "moekit/spec.h"

namespace moekit::torch_ops {

// The spec parsed from config.json text as transformers reads it (load_spec's rules), cached:
// every call with the same text returns the same object. Throws moekit::Error naming the key.
const MoeSpec& spec_from_json(const std::string& config_json);

// The parsed spec's fields as JSON (what the Python MoeSpec exposes and the fake kernels read).
std::string spec_summary_json(const MoeSpec& spec);

}  // namespace moekit::torch_ops
