// `moekit run --input x.safetensors --output out.safetensors`: the layer's input read from, and
// its outputs written to, safetensors files, so a run can be compared with any other
// implementation of the block.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "moekit/dtype.h"
#include "moekit/layer.h"
#include "moekit/spec.h"

namespace moekit::cli {

// x [T, H] from `path`: the tensor named "x", or the file's only tensor; BF16 as it is, F32
// rounded to bf16 (the layer's input dtype). Throws naming the file, the tensor and what was
// wrong (dtype, rank, H against the spec's hidden size, T = 0).
std::vector<Bf16> read_run_input(const std::string& path, const MoeSpec& spec, int& tokens);

// Writes to `path`: y [T, H] f32; topk_ids [T, k] i32 and topk_weights [T, k] f32 (the routed
// experts by descending selection key and the weight each one's output is multiplied by, routed
// scaling included); router_logits [T, C] f32 (C = E, or E + 1 with a gated shared expert's gate
// logit last), and `metadata` as the file's string metadata.
void write_run_output(const std::string& path, const MoeSpec& spec, const ForwardResult& r,
                      const std::vector<float>& router_logits,
                      const std::map<std::string, std::string>& metadata);

}  // namespace moekit::cli
