// What the expert-parallel tests share: one rank's engine-side weight stacks (the experts the
// placement gives it, in its row order, then the fused shared slots and/or the unfused shared
// MLP) built from a whole layer's LayerWeights, and the view that borrows them.
#pragma once

#include <cstring>
#include <vector>

#include "moekit/moe.h"
#include "moekit/weights.h"

namespace moekit::test {

struct RankStacks {
  std::vector<Bf16> w13, w2, shared_w13, shared_w2;
  std::vector<float> b13, b2;
  MoeWeightsView view;
};

// The router and its biases are borrowed from `lw` (replicated on every rank); the expert stacks
// are copies: rows = `experts` (logical ids), then the S fused slots when `fused_slots`.
inline RankStacks rank_stacks(const LayerWeights& lw, const std::vector<int>& experts,
                              bool fused_slots, bool unfused_shared) {
  const MoeSpec& spec = lw.spec();
  const int E = spec.num_experts;
  const size_t H = spec.hidden, I = spec.expert_intermediate;
  const int count = static_cast<int>(experts.size());
  const int slots = fused_slots ? spec.shared_slots() : 0;
  RankStacks s;
  for (int r = 0; r < count + slots; ++r) {
    const int e = r < count ? experts[r] : E + (r - count);
    const ExpertView ex = lw.expert(e);
    s.w13.insert(s.w13.end(), ex.w13, ex.w13 + 2 * I * H);
    s.w2.insert(s.w2.end(), ex.w2, ex.w2 + H * I);
    if (spec.has_expert_bias && r < count) {
      s.b13.insert(s.b13.end(), ex.b13, ex.b13 + 2 * I);
      s.b2.insert(s.b2.end(), ex.b2, ex.b2 + H);
    }
  }
  if (unfused_shared && lw.shared_w13() != nullptr) {
    const size_t Is = spec.shared_intermediate;
    s.shared_w13.assign(lw.shared_w13(), lw.shared_w13() + 2 * Is * H);
    s.shared_w2.assign(lw.shared_w2(), lw.shared_w2() + H * Is);
  }
  MoeWeightsView& v = s.view;
  v.router_weight = lw.router_weight();
  v.router_bias = lw.router_bias();
  v.correction_bias = lw.correction_bias();
  v.w13 = s.w13.empty() ? nullptr : s.w13.data();
  v.w2 = s.w2.empty() ? nullptr : s.w2.data();
  v.b13 = s.b13.empty() ? nullptr : s.b13.data();
  v.b2 = s.b2.empty() ? nullptr : s.b2.data();
  v.fused_slots = slots;
  v.shared_w13 = s.shared_w13.empty() ? nullptr : s.shared_w13.data();
  v.shared_w2 = s.shared_w2.empty() ? nullptr : s.shared_w2.data();
  v.expert_offset = 0;
  v.expert_count = count;
  return s;
}

}  // namespace moekit::test
