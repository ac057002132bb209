// Small helpers shared by the CLI's subcommands: model loading, random inputs, formatting.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moekit/dtype.h"
#include "moekit/layer.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit::cli {

// The layer to run: `requested` if >= 0 (must be an MoE layer), else the spec's first MoE layer.
int pick_moe_layer(const MoeSpec& spec, int requested);

// Weights of one MoE layer: from a checkpoint directory if given, else random from the seed;
// the experts and the shared MLP held in `format` (make_random_weights, LoadOptions).
std::unique_ptr<LayerWeights> load_layer_weights(const MoeSpec& spec, int layer,
                                                 const std::string& weights_dir, uint64_t seed,
                                                 ExpertFormat format = ExpertFormat::Bf16);

// Deterministic activations x[tokens, hidden] in [-1, 1), bf16.
std::vector<Bf16> random_input(const MoeSpec& spec, int tokens, uint64_t seed);

// Integer options in plain decimal only: CLI11 itself also takes 0x10, 0b11, 0o17 and 1e3, which
// a careless user does not mean. non_negative refuses a leading '-' too (--layer -7 is not "the
// default layer", --iterations -5 is not "automatic").
CLI::Validator decimal_integer(bool non_negative);

// Refuses `option` when it was given on the command line but does nothing on `device`.
void refuse_unused_option(const CLI::App& cmd, const char* option, const std::string& device,
                          const char* works_on);

// Throws naming the first NaN or infinity of y[tokens, hidden] and `what` (the mode that made it).
void check_finite_output(const std::vector<float>& y, int hidden, const std::string& what);

// "1.23 GB", "456.0 MB", "789 B".
std::string human_bytes(double bytes);

// The experts' format `moekit bench --dtype` (and plan's) names (bf16, fp8, mxfp4, mxfp8; config:
// what the spec's quantization_config declares); throws naming `command` and the choices.
ExpertFormat bench_format(const MoeSpec& spec, const std::string& dtype,
                          const char* command = "bench");

// The GPU layer's (and the plan's) two settings for experts held in format f: expert_dtype
// (F8_E4M3 for Fp8Block, else BF16) and mx_format (f for Mxfp4 / Mxfp8, else Bf16).
DType gpu_expert_dtype(ExpertFormat f);
ExpertFormat gpu_mx_format(ExpertFormat f);

// Max over elements of |a - b| / max(max|b|, tiny): the difference relative to the output's scale
// (infinity when an element differs by NaN).
double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace moekit::cli
