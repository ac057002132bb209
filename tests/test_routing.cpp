// Tests of the CPU reference routing (src/cpu/routing_reference.cpp) and the fuse_shared switch
// (src/cpu/fuse_shared.cpp). Expected ids and weights are derived by hand in each test from the
// formulas of DESIGN.md §1 on tiny E (8), never by calling the code under test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "common/random_values.h"
#include "expect_error.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/routing.h"

namespace moekit {
namespace {

using cpu_reference::route;

RoutingConfig make_cfg(int experts, int top_k, Scoring scoring) {
  RoutingConfig cfg;
  cfg.num_experts = experts;
  cfg.top_k = top_k;
  cfg.scoring = scoring;
  cfg.logits_columns = experts;
  return cfg;
}

using test::expect_error;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplus(double x) { return std::log(1.0 + std::exp(x)); }

void expect_ids(const Routing& r, int token, const std::vector<int>& ids) {
  ASSERT_EQ(r.slots, static_cast<int>(ids.size()));
  for (size_t j = 0; j < ids.size(); ++j)
    EXPECT_EQ(r.ids[token * r.slots + j], ids[j]) << "token " << token << " slot " << j;
}

void expect_weights(const Routing& r, int token, const std::vector<double>& w, double rel = 1e-6) {
  ASSERT_EQ(r.slots, static_cast<int>(w.size()));
  for (size_t j = 0; j < w.size(); ++j)
    EXPECT_NEAR(r.weights[token * r.slots + j], w[j], rel * std::fabs(w[j]) + 1e-30)
        << "token " << token << " slot " << j;
}

TEST(Routing, SoftmaxRenormalisedHandComputed) {
  // logits ln(1..8): softmax scores are (e+1)/36; top-2 = experts 7, 6.
  std::vector<float> logits(8);
  for (int e = 0; e < 8; ++e) logits[e] = std::log(static_cast<float>(e + 1));
  RoutingConfig cfg = make_cfg(8, 2, Scoring::Softmax);
  cfg.renormalize = true;
  Routing r = route(cfg, logits.data(), 1, nullptr);
  expect_ids(r, 0, {7, 6});
  expect_weights(r, 0, {8.0 / 15.0, 7.0 / 15.0});
  EXPECT_TRUE(r.shared_scale.empty());

  cfg.renormalize = false;  // Qwen2-MoE: the raw softmax scores
  r = route(cfg, logits.data(), 1, nullptr);
  expect_ids(r, 0, {7, 6});
  expect_weights(r, 0, {8.0 / 36.0, 7.0 / 36.0});
}

TEST(Routing, SoftmaxOfTopkHandComputed) {
  // gpt-oss: top-k on the (already router-biased) logits, softmax over the k picked only.
  const std::vector<float> logits = {0.5f, 3.0f, 2.0f, -1.0f, 1.0f, 0.0f, 2.5f, -2.0f};
  RoutingConfig cfg = make_cfg(8, 4, Scoring::SoftmaxOfTopk);
  cfg.has_router_bias = true;
  Routing r = route(cfg, logits.data(), 1, nullptr);
  expect_ids(r, 0, {1, 6, 2, 4});
  const double d = std::exp(3.0) + std::exp(2.5) + std::exp(2.0) + std::exp(1.0);
  expect_weights(r, 0,
                 {std::exp(3.0) / d, std::exp(2.5) / d, std::exp(2.0) / d, std::exp(1.0) / d});
}

TEST(Routing, SigmoidBiasOrdersByKeyWeightsUnbiasedScaledAfterRenorm) {
  // Expert 2 has a low score but a +3 bias: it is picked first (highest key), yet its weight comes
  // from sigmoid(-1), not from the key. rsf multiplies after renormalisation, so weights sum to it.
  const std::vector<float> logits = {2.0f, 0.0f, -1.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 3.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  RoutingConfig cfg = make_cfg(8, 2, Scoring::Sigmoid);
  cfg.has_correction_bias = true;
  cfg.renormalize = true;
  cfg.routed_scaling_factor = 2.5f;
  Routing r = route(cfg, logits.data(), 1, bias.data());
  expect_ids(r, 0, {2, 0});
  const double s2 = sigmoid(-1.0), s0 = sigmoid(2.0);
  expect_weights(r, 0, {2.5 * s2 / (s2 + s0), 2.5 * s0 / (s2 + s0)});
  EXPECT_NEAR(r.weights[0] + r.weights[1], 2.5, 1e-6);

  // Without renormalisation rsf still applies to the raw scores.
  cfg.renormalize = false;
  r = route(cfg, logits.data(), 1, bias.data());
  expect_weights(r, 0, {2.5 * s2, 2.5 * s0});
}

TEST(Routing, ExtremeBiasesTinyScoresKeepNonzeroRenormalisedWeights) {
  // Biases +-12 and scores ~1e-8: in fp32, key = 12 + 1e-8 == 12 for both picked experts (an exact
  // tie, lower id first), and key - bias would be exactly 0. Weights must come from the logits.
  std::vector<float> logits(8, -18.0f), bias(8, -12.0f);
  logits[3] = -18.5f;
  logits[5] = -17.5f;
  bias[3] = 12.0f;
  bias[5] = 12.0f;
  RoutingConfig cfg = make_cfg(8, 2, Scoring::Sigmoid);
  cfg.has_correction_bias = true;
  cfg.renormalize = true;
  cfg.routed_scaling_factor = 2.5f;
  Routing r = route(cfg, logits.data(), 1, bias.data());
  expect_ids(r, 0, {3, 5});
  const double s3 = sigmoid(-18.5), s5 = sigmoid(-17.5);
  ASSERT_GT(s3, 1e-9);
  ASSERT_LT(s5, 1e-7);
  expect_weights(r, 0, {2.5 * s3 / (s3 + s5), 2.5 * s5 / (s3 + s5)}, 1e-5);
  EXPECT_GT(r.weights[0], 0.5f);  // about 2.5 * 0.27
  EXPECT_NEAR(r.weights[0] + r.weights[1], 2.5, 1e-6);
}

TEST(Routing, MaskedGroupNeverPickedWhenAllKeysNegative) {
  // Groups {0,1},{2,3},{4,5},{6,7}; every bias -5 so every key is in (-5,-4). Expert 0 has the
  // single best key, but group 0's top-2 sum (sigmoid(3)+sigmoid(-2.5)-10 = -8.97) loses to group
  // 2's (sigmoid(2)+sigmoid(1.5)-10 = -8.30). Masked keys must be -inf: a 0 would beat every key.
  const std::vector<float> logits = {3.0f, -2.5f, -1.0f, -1.0f, 2.0f, 1.5f, 0.0f, 0.0f};
  const std::vector<float> bias(8, -5.0f);
  RoutingConfig cfg = make_cfg(8, 2, Scoring::Sigmoid);
  cfg.has_correction_bias = true;
  cfg.n_group = 4;
  cfg.topk_group = 1;
  cfg.group_score_top2_sum = true;
  cfg.renormalize = true;
  Routing r = route(cfg, logits.data(), 1, bias.data());
  expect_ids(r, 0, {4, 5});
  const double s4 = sigmoid(2.0), s5 = sigmoid(1.5);
  expect_weights(r, 0, {s4 / (s4 + s5), s5 / (s4 + s5)});

  // Keeping two groups adds group 0 (-8.97 beats group 3's -9 and group 1's -9.46): expert 0 first.
  cfg.topk_group = 2;
  r = route(cfg, logits.data(), 1, bias.data());
  expect_ids(r, 0, {0, 4});
}

TEST(Routing, GroupScoreTiesKeepLowerGroup) {
  // Group max scoring (no bias): groups 1 and 3 both have max logit 1.0 exactly; group 1 wins.
  const std::vector<float> logits = {-1.0f, -2.0f, 1.0f, 0.5f, -1.0f, -1.5f, 1.0f, 0.9f};
  RoutingConfig cfg = make_cfg(8, 2, Scoring::Sigmoid);
  cfg.n_group = 4;
  cfg.topk_group = 1;
  cfg.renormalize = true;
  Routing r = route(cfg, logits.data(), 1, nullptr);
  expect_ids(r, 0, {2, 3});
  const double a = sigmoid(1.0), b = sigmoid(0.5);
  expect_weights(r, 0, {a / (a + b), b / (a + b)});
}

TEST(Routing, ExactTiesLowerIdWins) {
  std::vector<float> logits(8, 0.25f);
  RoutingConfig cfg = make_cfg(8, 3, Scoring::Softmax);
  cfg.renormalize = true;
  Routing r = route(cfg, logits.data(), 1, nullptr);
  expect_ids(r, 0, {0, 1, 2});
  expect_weights(r, 0, {1.0 / 3, 1.0 / 3, 1.0 / 3});

  // Duplicate pairs: (1,2) tie above (0,3); the lower of each pair comes first.
  const std::vector<float> dup = {1.0f, 2.0f, 2.0f, 1.0f, -1.0f, -1.0f, -1.0f, -1.0f};
  cfg = make_cfg(8, 3, Scoring::Sigmoid);
  r = route(cfg, dup.data(), 1, nullptr);
  expect_ids(r, 0, {1, 2, 0});
  expect_weights(r, 0, {sigmoid(2.0), sigmoid(2.0), sigmoid(1.0)});
}

TEST(Routing, NonFiniteLogitThrowsNamingTokenAndExpert) {
  std::vector<float> logits(2 * 8, 0.0f);
  logits[1 * 8 + 5] = std::numeric_limits<float>::quiet_NaN();
  const RoutingConfig cfg = make_cfg(8, 2, Scoring::Sigmoid);
  expect_error([&] { route(cfg, logits.data(), 2, nullptr); }, {"token 1", "expert 5", "nan"});
  logits[1 * 8 + 5] = std::numeric_limits<float>::infinity();
  expect_error([&] { route(cfg, logits.data(), 2, nullptr); }, {"token 1", "expert 5", "inf"});
}

TEST(Routing, SqrtSoftplusBiasHandComputed) {
  // DeepSeek-V4: s = sqrt(softplus(x)), key = s + bias, weights renormalised then * 1.5.
  std::vector<float> logits(8, -5.0f), bias(8, 0.0f);
  logits[0] = 0.0f;  // key sqrt(ln 2) + 0.1 = 0.933
  bias[0] = 0.1f;
  logits[1] = 30.0f;  // the best score, but key sqrt(30) - 10 = -4.52
  bias[1] = -10.0f;
  logits[2] = -2.0f;  // key 0.356 + 0.5 = 0.856
  bias[2] = 0.5f;
  logits[3] = 1.0f;  // key sqrt(ln(1+e)) = 1.146
  RoutingConfig cfg = make_cfg(8, 2, Scoring::SqrtSoftplus);
  cfg.has_correction_bias = true;
  cfg.renormalize = true;
  cfg.routed_scaling_factor = 1.5f;
  Routing r = route(cfg, logits.data(), 1, bias.data());
  expect_ids(r, 0, {3, 0});
  const double s3 = std::sqrt(std::log(1.0 + std::exp(1.0))), s0 = std::sqrt(std::log(2.0));
  expect_weights(r, 0, {1.5 * s3 / (s3 + s0), 1.5 * s0 / (s3 + s0)});
  EXPECT_NEAR(std::sqrt(softplus(1.0)), s3, 1e-15);
}

TEST(Routing, DeepSeekV2GroupMaxNoRenormScaled) {
  // Softmax of ln p with p = {1,9,2,3,8,1,7,5} (sum 36); group max keeps groups 0 (9) and 2 (8),
  // so expert 6 (7/36) is out; experts 0 and 5 tie at 1/36 -> 0. No renorm; rsf 16.
  const std::vector<double> p = {1, 9, 2, 3, 8, 1, 7, 5};
  std::vector<float> logits(8);
  for (int e = 0; e < 8; ++e) logits[e] = static_cast<float>(std::log(p[e]));
  RoutingConfig cfg = make_cfg(8, 3, Scoring::Softmax);
  cfg.n_group = 4;
  cfg.topk_group = 2;
  cfg.routed_scaling_factor = 16.0f;
  Routing r = route(cfg, logits.data(), 1, nullptr);
  expect_ids(r, 0, {1, 4, 0});
  expect_weights(r, 0, {16.0 * 9 / 36, 16.0 * 8 / 36, 16.0 * 1 / 36}, 1e-5);
}

TEST(Routing, FusedSlotsPlainAndGated) {
  // Plain shared expert, 2 slots: ids E, E+1 with weight 1 after the routed ones.
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f};
  RoutingConfig cfg = make_cfg(8, 2, Scoring::Sigmoid);
  cfg.renormalize = true;
  cfg.routed_scaling_factor = 2.0f;
  cfg.shared_kind = SharedKind::Plain;
  cfg.shared_slots = 2;
  Routing r = route(cfg, logits.data(), 1, nullptr);
  ASSERT_EQ(r.slots, 4);
  expect_ids(r, 0, {7, 6, 8, 9});
  const double a = sigmoid(7.0), b = sigmoid(6.0);
  expect_weights(r, 0, {2.0 * a / (a + b), 2.0 * b / (a + b), 1.0, 1.0});
  ASSERT_EQ(r.shared_scale.size(), 1u);
  EXPECT_EQ(r.shared_scale[0], 1.0f);

  // Gated (Qwen2-MoE): logits carry a 9th column, the shared gate logit; slot weight and
  // shared_scale are sigmoid of it per token. Unfused: no slots, the scale alone.
  const std::vector<float> gated = {0, 1, 2, 3, 4, 5, 6, 7, 0.0f,             // gate 0 -> 0.5
                                    7, 6, 5, 4, 3, 2, 1, 0, std::log(3.0f)};  // ln 3 -> 0.75
  cfg = make_cfg(8, 2, Scoring::Softmax);
  cfg.logits_columns = 9;
  cfg.shared_kind = SharedKind::Gated;
  cfg.shared_slots = 3;
  r = route(cfg, gated.data(), 2, nullptr);
  expect_ids(r, 0, {7, 6, 8, 9, 10});
  expect_ids(r, 1, {0, 1, 8, 9, 10});
  EXPECT_FLOAT_EQ(r.weights[2], 0.5f);
  EXPECT_FLOAT_EQ(r.weights[4], 0.5f);
  EXPECT_FLOAT_EQ(r.weights[5 + 3], 0.75f);
  ASSERT_EQ(r.shared_scale.size(), 2u);
  EXPECT_FLOAT_EQ(r.shared_scale[0], 0.5f);
  EXPECT_FLOAT_EQ(r.shared_scale[1], 0.75f);
  cfg.shared_slots = 0;
  r = route(cfg, gated.data(), 2, nullptr);
  expect_ids(r, 1, {0, 1});
  EXPECT_FLOAT_EQ(r.shared_scale[1], 0.75f);
}

TEST(Routing, RandomLogitsInvariants) {
  // Distinct ids, keys non-increasing along the slots, nothing outside the kept groups.
  const int num_e = 64, k = 8, tokens = 200;
  std::vector<float> logits(tokens * num_e), bias(num_e);
  const uint64_t s = random_values::stream_key(7, 0, random_values::Tensor::Input, -1);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 4.0f * random_values::uniform(s, i);
  for (int e = 0; e < num_e; ++e) bias[e] = random_values::uniform(s, 100000 + e);
  RoutingConfig cfg = make_cfg(num_e, k, Scoring::Sigmoid);
  cfg.has_correction_bias = true;
  cfg.n_group = 8;
  cfg.topk_group = 3;
  cfg.group_score_top2_sum = true;
  cfg.renormalize = true;
  cfg.routed_scaling_factor = 2.5f;
  const Routing r = route(cfg, logits.data(), tokens, bias.data());
  for (int t = 0; t < tokens; ++t) {
    std::set<int> ids, groups;
    float prev = std::numeric_limits<float>::infinity();
    double sum = 0;
    for (int j = 0; j < k; ++j) {
      const int id = r.ids[t * k + j];
      ids.insert(id);
      groups.insert(id / 8);
      const float key = 1.0f / (1.0f + std::exp(-logits[t * num_e + id])) + bias[id];
      EXPECT_LE(key, prev);
      prev = key;
      sum += r.weights[t * k + j];
    }
    EXPECT_EQ(ids.size(), static_cast<size_t>(k));
    EXPECT_LE(groups.size(), 3u);
    EXPECT_NEAR(sum, 2.5, 1e-5);
  }
}

TEST(Routing, BadConfigsThrow) {
  std::vector<float> logits(8, 0.0f);
  RoutingConfig cfg = make_cfg(8, 9, Scoring::Softmax);
  expect_error([&] { route(cfg, logits.data(), 1, nullptr); }, {"top_k", "9"});
  cfg = make_cfg(8, 2, Scoring::Softmax);
  cfg.n_group = 3;
  expect_error([&] { route(cfg, logits.data(), 1, nullptr); }, {"n_group", "3"});
  cfg = make_cfg(8, 2, Scoring::Sigmoid);
  cfg.has_correction_bias = true;
  expect_error([&] { route(cfg, logits.data(), 1, nullptr); }, {"correction_bias"});
  cfg = make_cfg(8, 2, Scoring::Softmax);
  cfg.shared_kind = SharedKind::Gated;  // needs the gate column
  expect_error([&] { route(cfg, logits.data(), 1, nullptr); }, {"logits_columns", "9"});
}

TEST(Routing, FromSpecFusionNeedsWholeSlots) {
  MoeSpec spec;
  spec.name = "tiny";
  spec.hidden = 16;
  spec.num_experts = 8;
  spec.top_k = 2;
  spec.expert_intermediate = 16;
  spec.shared_kind = SharedKind::Plain;
  spec.shared_intermediate = 32;
  spec.scoring = Scoring::Sigmoid;
  spec.routed_scaling_factor = 2.5f;
  RoutingConfig cfg = RoutingConfig::from_spec(spec, true);
  EXPECT_EQ(cfg.shared_slots, 2);
  EXPECT_EQ(cfg.slots_per_token(), 4);
  EXPECT_EQ(cfg.logits_columns, 8);
  EXPECT_EQ(cfg.routed_scaling_factor, 2.5f);
  EXPECT_EQ(RoutingConfig::from_spec(spec, false).shared_slots, 0);
  spec.shared_intermediate = 24;
  expect_error([&] { RoutingConfig::from_spec(spec, true); },
                    {"shared_intermediate", "24", "expert_intermediate", "16"});
  EXPECT_EQ(RoutingConfig::from_spec(spec, false).shared_slots, 0);
  spec.shared_kind = SharedKind::Gated;
  spec.shared_intermediate = 64;
  cfg = RoutingConfig::from_spec(spec, true);
  EXPECT_EQ(cfg.shared_slots, 4);
  EXPECT_EQ(cfg.logits_columns, 9);
}

// Sets (or unsets) MOEKIT_FUSE_SHARED_EXPERTS for one scope.
class ScopedFuseEnv {
 public:
  explicit ScopedFuseEnv(const char* value) {
    if (const char* old = std::getenv(kName)) {
      old_ = old;
      had_ = true;
    }
    set(value);
  }
  ~ScopedFuseEnv() { set(had_ ? old_.c_str() : nullptr); }

 private:
  static void set(const char* value) {
    if (value)
      setenv(kName, value, 1);
    else
      unsetenv(kName);
  }

  static constexpr const char* kName = "MOEKIT_FUSE_SHARED_EXPERTS";
  std::string old_;
  bool had_ = false;
};

TEST(FuseShared, NamesParseAndEnvironment) {
  for (FuseShared f : {FuseShared::Auto, FuseShared::On, FuseShared::Off})
    EXPECT_EQ(parse_fuse_shared(fuse_shared_name(f)), f);
  EXPECT_STREQ(fuse_shared_name(FuseShared::On), "on");
  expect_error([] { parse_fuse_shared("yes"); }, {"'yes'", "auto", "on", "off"});
  expect_error([] { parse_fuse_shared("ON"); }, {"'ON'"});
  {
    ScopedFuseEnv env(nullptr);
    EXPECT_EQ(fuse_shared_from_env(FuseShared::Auto), FuseShared::Auto);
  }
  {
    ScopedFuseEnv env("off");
    EXPECT_EQ(fuse_shared_from_env(FuseShared::On), FuseShared::Off);
  }
  {
    ScopedFuseEnv env("1");
    EXPECT_EQ(fuse_shared_from_env(FuseShared::Off), FuseShared::On);
  }
  {
    ScopedFuseEnv env("0");
    EXPECT_EQ(fuse_shared_from_env(FuseShared::Auto), FuseShared::Off);
  }
  {
    ScopedFuseEnv env("");
    EXPECT_EQ(fuse_shared_from_env(FuseShared::On), FuseShared::On);
  }
  {
    ScopedFuseEnv env("maybe");
    expect_error([] { fuse_shared_from_env(FuseShared::Auto); },
                      {"MOEKIT_FUSE_SHARED_EXPERTS", "'maybe'", "auto", "on", "off"});
  }
}

}  // namespace
}  // namespace moekit
