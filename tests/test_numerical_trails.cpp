// One regression test per numerical trail that serving engines have shipped:
//   - group masks filled with 0 instead of -inf (keys can be negative),
//   - weights recovered as key - bias (all zero for biases ~12 and scores ~1e-8),
//   - fused shared-expert ids outside the range the dispatch counts (E + S weight rows),
//   - duplicate expert ids in one token (ties).
// LayerWeights with a hand-set router and correction bias (the experts and shared MLP stay the
// random ones) drive the whole layer on both CPU backends, so the trails are checked where they
// happened in serving engines: in the layer, not only in the routing function.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "expect_error.h"
#include "io_test_util.h"
#include "moekit/cpu_fast.h"
#include "moekit/dtype.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/routing.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

using test::expect_error;
using test::small_spec;

class HandSetRouter final : public LayerWeights {
 public:
  explicit HandSetRouter(std::unique_ptr<LayerWeights> base)
      : LayerWeights(base->spec(), base->layer()), base_(std::move(base)) {
    const MoeSpec& s = spec_;
    MK_CHECK(s.router_dtype == DType::BF16, "test expects a bf16 router");
    router_weight_.assign(static_cast<size_t>(s.router_columns()) * s.hidden * 2, 0);
    correction_bias_.assign(s.num_experts, 0.0f);
    if (base_->shared_w13()) {
      const size_t is = s.shared_intermediate, h = s.hidden;
      shared_w13_.assign(base_->shared_w13(), base_->shared_w13() + 2 * is * h);
      shared_w2_.assign(base_->shared_w2(), base_->shared_w2() + h * is);
    }
  }
  // Router row e := value / H in every column, so x = all ones gives logit e = value exactly
  // (value / H must be exact in bf16: 8 significant bits).
  void set_logit(int e, float value) {
    Bf16* wg =
        reinterpret_cast<Bf16*>(router_weight_.data()) + static_cast<size_t>(e) * spec_.hidden;
    const Bf16 v = float_to_bf16(value / static_cast<float>(spec_.hidden));
    EXPECT_EQ(bf16_to_float(v) * spec_.hidden, value) << "logit " << value << " not exact";
    for (int h = 0; h < spec_.hidden; ++h) wg[h] = v;
  }
  void set_bias(int e, float b) { correction_bias_[e] = b; }

  ExpertView expert(int e) const override { return base_->expert(e); }
  int materialised_experts() const override { return base_->materialised_experts(); }
  std::string origin() const override { return "hand-set router over " + base_->origin(); }

 private:
  std::unique_ptr<LayerWeights> base_;
};

std::vector<Bf16> ones(const MoeSpec& s, int tokens) {
  return std::vector<Bf16>(static_cast<size_t>(tokens) * s.hidden, float_to_bf16(1.0f));
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(NumericalTrail, MaskedGroupKeysAreMinusInfinityNotZero) {
  // small DeepSeek-V3: E 16 in 8 groups of 2, 4 groups kept, top-8 = every expert of the kept
  // groups. Every bias is -4, so every key is negative; a group mask of 0 would make the masked
  // experts the *best* keys and they would be picked instead.
  const MoeSpec s = small_spec("deepseek-v3");
  ASSERT_EQ(s.n_group, 8);
  ASSERT_EQ(s.topk_group, 4);
  HandSetRouter w(make_random_weights(s, s.moe_layers.front(), 11));
  // Group g's logits: 0.5 * ((g * 5) % 8) - 2 and one below it: kept groups have the highest g*5%8.
  std::set<int> kept_groups;
  for (int g = 0; g < 8; ++g) {
    const float top = 0.5f * static_cast<float>((g * 5) % 8) - 2.0f;
    w.set_logit(2 * g, top);
    w.set_logit(2 * g + 1, top - 0.25f);
    if ((g * 5) % 8 >= 4) kept_groups.insert(g);
  }
  for (int e = 0; e < 16; ++e) w.set_bias(e, -4.0f);
  ASSERT_EQ(kept_groups.size(), 4u);
  const std::vector<Bf16> x = ones(s, 3);
  for (bool fast : {false, true}) {
    const ForwardResult r = fast ? cpu_fast::forward(w, x.data(), 3, FuseShared::Off)
                                 : cpu_reference::forward(w, x.data(), 3, FuseShared::Off);
    for (int t = 0; t < 3; ++t) {
      for (int j = 0; j < s.top_k; ++j) {
        const int id = r.routing.ids[t * r.routing.slots + j];
        EXPECT_TRUE(kept_groups.count(id / 2))
            << "expert " << id << " of masked group " << id / 2 << " picked (fast " << fast << ")";
      }
    }
  }
}

TEST(NumericalTrail, WeightsFromScoreNotKeyMinusBias) {
  // Biases ~12 and logits ~ -18 (sigmoid ~ 1.5e-8): in fp32, key - bias == 0 exactly, so weights
  // recovered that way are all zero (and renormalising 0/0 gives 0 or NaN). The weights must be
  // the renormalised sigmoid scores x routed_scaling_factor, and the output non-zero.
  const MoeSpec s = small_spec("deepseek-v3");
  HandSetRouter w(make_random_weights(s, s.moe_layers.front(), 12));
  for (int e = 0; e < 16; ++e) {
    w.set_logit(e, -18.0f - 0.125f * static_cast<float>(e));
    w.set_bias(e, 12.0f + 0.01f * static_cast<float>(e));  // selection by bias: 15, 14, ..., 8
  }
  const float key15 = static_cast<float>(sigmoid(-18.0 - 0.125 * 15)) + (12.0f + 0.15f);
  ASSERT_EQ(key15 - (12.0f + 0.15f), 0.0f) << "the case must be the one where key - bias fails";
  const std::vector<Bf16> x = ones(s, 2);
  double denom = 0.0;
  for (int e = 8; e < 16; ++e) denom += sigmoid(-18.0 - 0.125 * e);
  for (bool fast : {false, true}) {
    const ForwardResult r = fast ? cpu_fast::forward(w, x.data(), 2, FuseShared::Off)
                                 : cpu_reference::forward(w, x.data(), 2, FuseShared::Off);
    for (int t = 0; t < 2; ++t) {
      for (int j = 0; j < 8; ++j) {
        const int id = r.routing.ids[t * r.routing.slots + j];
        EXPECT_EQ(id, 15 - j);
        const double want = sigmoid(-18.0 - 0.125 * id) / denom * s.routed_scaling_factor;
        EXPECT_NEAR(r.routing.weights[t * r.routing.slots + j], want, 1e-5 * want);
      }
    }
    // The routed part is non-zero: compare with the unfused shared MLP alone.
    std::vector<float> shared(s.hidden);
    cpu_reference::shared_forward(w, x.data(), shared.data());
    double diff = 0.0;
    for (int h = 0; h < s.hidden; ++h) diff += std::fabs(r.y[h] - shared[h]);
    EXPECT_GT(diff, 1e-3) << "routed experts contributed nothing (fast " << fast << ")";
  }
}

TEST(NumericalTrail, FusedSharedIdsStayInsideWeightRows) {
  // The dispatch counts experts from the weight rows E + S. Every id a fused routing emits must
  // be < E + S, the shared ones exactly E..E+S-1, and expert(id) valid for each.
  for (const char* model : {"deepseek-v3", "qwen2-57b-a14b", "minimax-m3", "deepseek-v2-lite"}) {
    SCOPED_TRACE(model);
    const MoeSpec s = small_spec(model);
    ASSERT_TRUE(s.can_fuse_shared());
    const int E = s.num_experts, S = s.shared_slots(), rows = s.weight_rows(true);
    ASSERT_EQ(rows, E + S);
    const auto w = make_random_weights(s, s.moe_layers.front(), 4);
    std::vector<Bf16> x(static_cast<size_t>(7) * s.hidden);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(std::sin(0.37f * i));
    for (bool fast : {false, true}) {
      const ForwardResult r = fast ? cpu_fast::forward(*w, x.data(), 7, FuseShared::On)
                                   : cpu_reference::forward(*w, x.data(), 7, FuseShared::On);
      ASSERT_TRUE(r.fused);
      ASSERT_EQ(r.routing.slots, s.top_k + S);
      for (int t = 0; t < 7; ++t) {
        for (int j = 0; j < r.routing.slots; ++j) {
          const int id = r.routing.ids[t * r.routing.slots + j];
          ASSERT_GE(id, 0);
          ASSERT_LT(id, rows);
          if (j >= s.top_k) EXPECT_EQ(id, E + (j - s.top_k));
          const ExpertView v = w->expert(id);
          EXPECT_NE(v.w13, nullptr);
          EXPECT_NE(v.w2, nullptr);
        }
      }
    }
    expect_error([&] { w->expert(rows); }, {"expected 0 <= e < " + std::to_string(rows)});
  }
}

TEST(NumericalTrail, TiedKeysNeverYieldDuplicateIds) {
  // Every logit and bias equal: all keys tie, group scores tie. Each token must still get
  // top_k distinct ids (lowest ids of the lowest kept groups), never one id twice.
  const MoeSpec s = small_spec("deepseek-v3");
  HandSetRouter w(make_random_weights(s, s.moe_layers.front(), 13));
  for (int e = 0; e < s.num_experts; ++e) w.set_logit(e, 0.5f);
  const std::vector<Bf16> x = ones(s, 5);
  for (bool fast : {false, true}) {
    const ForwardResult r = fast ? cpu_fast::forward(w, x.data(), 5, FuseShared::On)
                                 : cpu_reference::forward(w, x.data(), 5, FuseShared::On);
    for (int t = 0; t < 5; ++t) {
      std::set<int> seen;
      for (int j = 0; j < r.routing.slots; ++j) {
        const int id = r.routing.ids[t * r.routing.slots + j];
        EXPECT_TRUE(seen.insert(id).second) << "token " << t << " has expert " << id << " twice";
        if (j < s.top_k) EXPECT_EQ(id, j);  // ties: lower group, then lower id
      }
    }
  }
  // Softmax scoring, all logits tied (Qwen3): the same rule.
  const MoeSpec q = small_spec("qwen3-30b-a3b");
  std::vector<float> logits(static_cast<size_t>(3) * q.num_experts, -1.0f);
  const Routing r =
      cpu_reference::route(RoutingConfig::from_spec(q, false), logits.data(), 3, nullptr);
  for (int t = 0; t < 3; ++t) {
    std::set<int> seen(r.ids.begin() + t * r.slots, r.ids.begin() + (t + 1) * r.slots);
    EXPECT_EQ(static_cast<int>(seen.size()), q.top_k);
    EXPECT_EQ(*seen.rbegin(), q.top_k - 1);
  }
}

}  // namespace
}  // namespace moekit
