// Routing: fp32 router logits -> per-token expert ids and weights, every mode of DESIGN.md §1,
// with the fused shared-expert slots appended (DESIGN.md §2).
//
// The same RoutingConfig drives the CPU reference (src/cpu/routing_reference.cpp) and the GPU
// kernel (src/cuda/routing/), so both pick the same experts: selection in fp32, ties broken
// towards the lower expert id, masked groups' keys set to -inf, weights from the unbiased score.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/spec.h"

namespace moekit {

struct RoutingConfig {
  int num_experts = 0;     // E
  int top_k = 0;           // k
  int n_group = 1;
  int topk_group = 1;
  bool group_score_top2_sum = false;
  Scoring scoring = Scoring::Softmax;
  bool renormalize = false;
  float routed_scaling_factor = 1.0f;
  bool has_correction_bias = false;
  bool has_router_bias = false;  // gpt-oss: the bias is added to the logits before anything else
  // Fused shared slots appended after the k routed ones (0 when unfused or no shared expert).
  int shared_slots = 0;
  SharedKind shared_kind = SharedKind::None;
  // Columns of a logits row: E, or E+1 when column E is a gated shared expert's gate logit.
  int logits_columns = 0;

  int slots_per_token() const { return top_k + shared_slots; }
  static RoutingConfig from_spec(const MoeSpec& spec, bool fuse_shared);
};

struct Routing {
  int tokens = 0;
  int slots = 0;                // per token: top_k (+ shared slots when fused)
  std::vector<int32_t> ids;     // [tokens, slots]: routed ids by descending key, then E..E+S-1
  std::vector<float> weights;   // [tokens, slots]
  // Per token, sigmoid(gate logit) of a gated shared expert (1 when plain, empty when none).
  // Unfused paths multiply the shared MLP's output by it; fused paths carry it in the slot weights.
  std::vector<float> shared_scale;
};

}  // namespace moekit
