// The tensor-name tables behind include/moekit/checkpoint.h, shared by the loader
// (layer_tensors.cpp) and the writer (checkpoint_save.cpp). Patterns are relative to a layer
// prefix such as "model.layers.{L}."; "{e}" stands for the expert index.
#pragma once

#include <string>
#include <vector>

#include "moekit/checkpoint.h"

namespace moekit::io {

struct NameScheme {
  CheckpointNaming naming = CheckpointNaming::HfMlp;
  std::string block;            // "mlp.", "block_sparse_moe.", "ffn."
  std::string router;           // [E, H]
  std::string correction_bias;  // [E] fp32; empty when the family has none
  std::string router_bias;      // [E] (gpt-oss)
  // Per-expert form; empty for gpt-oss (stacked only).
  std::string expert_gate, expert_up, expert_down;
  // Stacked form: transformers-5 [E,2I,H] + [E,H,I], or gpt-oss [E,H,2I] + [E,I,H].
  std::string stacked_gate_up, stacked_down;
  std::string stacked_gate_up_bias, stacked_down_bias;  // gpt-oss
  bool interleaved = false;                             // gpt-oss gate/up columns
  // Shared MLP; empty when the naming has none.
  std::string shared_gate, shared_up, shared_down;
  std::string shared_expert_gate;  // Qwen2-MoE [1, H]
};

// The scheme of a naming with its MoE block called `block` ("" = the family's published one).
NameScheme name_scheme(CheckpointNaming naming, const std::string& block = "");
// Block names a loader tries for a naming, published first (transformers 5 renamed some to mlp.).
std::vector<std::string> block_candidates(CheckpointNaming naming);
// Layer prefixes, with "{L}", a loader tries in order.
const std::vector<std::string>& layer_prefix_candidates();
// The prefix a family publishes under.
std::string default_layer_prefix(CheckpointNaming naming, const MoeSpec& spec);
// Replaces "{L}" and "{e}".
std::string expand(const std::string& pattern, int layer, int expert = -1);

// Names of an fp8 weight's block-scale tensor, in the order a loader tries them:
// "<name>_scale_inv" (DeepSeek-V3, Kimi, GLM), "<name minus .weight>.scale" (DeepSeek-V4).
std::vector<std::string> scale_names(const std::string& weight_name);
// Names of an mxfp8 weight's e8m0 scale tensor, in the order a loader tries them:
// "<name>_scale_inv" (the fp8 checkpoints' spelling, kept by MiniMax-style exports),
// "<name>_scale" (NVIDIA ModelOpt / vLLM's ModelOptMxFp8 "weight_scale"), "<base>.scale".
std::vector<std::string> mx_scale_names(const std::string& weight_name);

}  // namespace moekit::io
