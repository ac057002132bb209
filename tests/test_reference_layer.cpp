// Tests of the CPU reference layer (src/cpu/reference_layer.cpp): experts against hand-written
// loops for every activation (clamps included), the router GEMM against a plain loop, fused ==
// unfused shared expert on every family that has one (scaled-down real configs), the assembly
// y = sum w * E + scale * shared, and the non-finite-input error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/random_values.h"
#include "expect_error.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/spec.h"
#include "moekit/weights.h"
#include "shrunk_spec.h"

namespace moekit {
namespace {

using random_values::stream_key;
using random_values::Tensor;
using random_values::uniform;
using test::expect_error;

constexpr int kHidden = 64;
constexpr int kInter = 16;
constexpr int kExperts = 32;

MoeSpec shrunk_spec(const std::string& model) {
  return test::shrunk_spec(model, kHidden, kInter, kExperts);
}
using test::random_input;

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float f : v) m = std::max(m, static_cast<double>(std::fabs(f)));
  return m;
}

// ---------------------------------------------------------------- experts vs hand-written loops

struct TinyExpert {
  int hidden = 8, inter = 16;
  std::vector<Bf16> w13, w2, x;
  std::vector<float> b13, b2;
};

TinyExpert make_tiny_expert(bool biases) {
  TinyExpert t;
  const uint64_t s = stream_key(42, 0, Tensor::ExpertW13, 0);
  size_t n = 0;
  for (int i = 0; i < 2 * t.inter * t.hidden; ++i) t.w13.push_back(float_to_bf16(uniform(s, n++)));
  for (int i = 0; i < t.hidden * t.inter; ++i) t.w2.push_back(float_to_bf16(uniform(s, n++)));
  // Large inputs (|x| < 8) so pre-activations reach past +-7 and +-10: the clamps must act.
  for (int i = 0; i < t.hidden; ++i) t.x.push_back(float_to_bf16(8.0f * uniform(s, n++)));
  if (biases) {
    for (int i = 0; i < 2 * t.inter; ++i) t.b13.push_back(uniform(s, n++));
    for (int i = 0; i < t.hidden; ++i) t.b2.push_back(uniform(s, n++));
  }
  return t;
}

MoeSpec tiny_spec(Activation act, float limit) {
  MoeSpec spec;
  spec.name = "tiny";
  spec.hidden = 8;
  spec.num_experts = 4;
  spec.top_k = 1;
  spec.expert_intermediate = 16;
  spec.activation = act;
  spec.swiglu_limit = limit;
  return spec;
}

// The textbook loops, straight from DESIGN.md §1, in double. Counts how often each clamp bites.
struct HandResult {
  std::vector<double> out;
  int gate_clamped = 0, up_clamped_hi = 0, up_clamped_lo = 0;
};

HandResult hand_expert(const MoeSpec& spec, const TinyExpert& t) {
  const int H = t.hidden, I = t.inter;
  HandResult r;
  std::vector<double> a(I);
  for (int i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int h = 0; h < H; ++h) {
      const double x = bf16_to_float(t.x[h]);
      g += bf16_to_float(t.w13[i * H + h]) * x;
      u += bf16_to_float(t.w13[(I + i) * H + h]) * x;
    }
    if (!t.b13.empty()) {
      g += t.b13[i];
      u += t.b13[I + i];
    }
    const double L = spec.swiglu_limit;
    if (L > 0) {
      if (g > L) g = L, ++r.gate_clamped;
      if (u > L) u = L, ++r.up_clamped_hi;
      if (u < -L) u = -L, ++r.up_clamped_lo;
    }
    if (spec.activation == Activation::Silu) {
      a[i] = g * (1.0 / (1.0 + std::exp(-g))) * u;
    } else {
      const double alpha = spec.swiglu_alpha, beta = spec.swiglu_beta;
      a[i] = (u + beta) * g * (1.0 / (1.0 + std::exp(-alpha * g)));
    }
  }
  r.out.assign(H, 0.0);
  for (int h = 0; h < H; ++h) {
    for (int i = 0; i < I; ++i) r.out[h] += bf16_to_float(t.w2[h * I + i]) * a[i];
    if (!t.b2.empty()) r.out[h] += t.b2[h];
  }
  return r;
}

std::vector<float> run_expert(const MoeSpec& spec, const TinyExpert& t) {
  ExpertView ex;
  ex.w13 = t.w13.data();
  ex.w2 = t.w2.data();
  ex.b13 = t.b13.empty() ? nullptr : t.b13.data();
  ex.b2 = t.b2.empty() ? nullptr : t.b2.data();
  std::vector<float> out(t.hidden);
  cpu_reference::expert_forward(spec, ex, t.x.data(), out.data());
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rel * scale) << "element " << i;
}

TEST(ReferenceExpert, SiluMatchesHandLoop) {
  const TinyExpert t = make_tiny_expert(false);
  const MoeSpec spec = tiny_spec(Activation::Silu, 0.0f);
  expect_close(run_expert(spec, t), hand_expert(spec, t).out, 1e-6);
}

TEST(ReferenceExpert, SiluWithSwigluLimitClampsGateAndUp) {
  // DeepSeek-V4: gate <= limit, |up| <= limit.
  const TinyExpert t = make_tiny_expert(false);
  const MoeSpec spec = tiny_spec(Activation::Silu, 10.0f);
  const HandResult want = hand_expert(spec, t);
  ASSERT_GT(want.gate_clamped, 0);
  ASSERT_GT(want.up_clamped_hi + want.up_clamped_lo, 0);
  expect_close(run_expert(spec, t), want.out, 1e-6);
  // The clamps change the result (the test above is not vacuous).
  const HandResult unclamped = hand_expert(tiny_spec(Activation::Silu, 0.0f), t);
  double diff = 0;
  for (size_t i = 0; i < want.out.size(); ++i)
    diff = std::max(diff, std::fabs(want.out[i] - unclamped.out[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(ReferenceExpert, SwigluOaiMatchesHandLoop) {
  // MiniMax-M3 swigluoai: limit 7, alpha 1.702, beta 1.
  const TinyExpert t = make_tiny_expert(false);
  const MoeSpec spec = tiny_spec(Activation::SwigluOai, 7.0f);
  const HandResult want = hand_expert(spec, t);
  ASSERT_GT(want.gate_clamped, 0);
  ASSERT_GT(want.up_clamped_hi, 0);
  ASSERT_GT(want.up_clamped_lo, 0);
  expect_close(run_expert(spec, t), want.out, 1e-6);
}

TEST(ReferenceExpert, GptOssInterleavedWithBiases) {
  // gpt-oss: same math as swigluoai in moekit's split layout, plus b13 before and b2 after.
  const TinyExpert t = make_tiny_expert(true);
  MoeSpec spec = tiny_spec(Activation::SwigluOaiInterleaved, 7.0f);
  spec.has_expert_bias = true;
  const HandResult want = hand_expert(spec, t);
  ASSERT_GT(want.gate_clamped, 0);
  expect_close(run_expert(spec, t), want.out, 1e-6);
  // An odd beta and alpha flow through.
  spec.swiglu_alpha = 1.25f;
  spec.swiglu_beta = 0.5f;
  expect_close(run_expert(spec, t), hand_expert(spec, t).out, 1e-6);
}

// ---------------------------------------------------------------- router GEMM

TEST(ReferenceRouter, LogitsMatchPlainLoop) {
  // bf16 router (deepseek-v3), fp32 router (minimax-m3), router bias (gpt-oss), gate column
  // (qwen2-57b: E+1 columns).
  for (const char* model : {"deepseek-v3", "minimax-m3", "gpt-oss-120b", "qwen2-57b-a14b"}) {
    SCOPED_TRACE(model);
    const MoeSpec spec = shrunk_spec(model);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 3);
    const int tokens = 5, cols = spec.router_columns();
    const std::vector<Bf16> x = random_input(tokens, kHidden, 11, 1.0f);
    const std::vector<float> got = cpu_reference::router_logits(*w, x.data(), tokens);
    ASSERT_EQ(got.size(), static_cast<size_t>(tokens * cols));
    for (int t = 0; t < tokens; ++t) {
      for (int c = 0; c < cols; ++c) {
        double acc = 0;
        for (int h = 0; h < kHidden; ++h) {
          const double wv =
              spec.router_dtype == DType::F32
                  ? static_cast<const float*>(w->router_weight())[c * kHidden + h]
                  : bf16_to_float(static_cast<const Bf16*>(w->router_weight())[c * kHidden + h]);
          acc += wv * bf16_to_float(x[t * kHidden + h]);
        }
        if (spec.has_router_bias) acc += w->router_bias()[c];
        EXPECT_NEAR(got[t * cols + c], acc, 1e-6 * std::max(1.0, std::fabs(acc)));
      }
    }
  }
  EXPECT_EQ(shrunk_spec("qwen2-57b-a14b").router_columns(), kExperts + 1);
}

// ---------------------------------------------------------------- fused == unfused

TEST(ReferenceLayer, FusedEqualsUnfusedEveryFamily) {
  const std::vector<std::pair<std::string, int>> families = {
      {"deepseek-v3", 1}, {"deepseek-v2-lite", 2}, {"kimi-k2", 1},           {"glm-4.5", 1},
      {"glm-5", 1},       {"minimax-m3", 1},       {"deepseek-v4-flash", 1}, {"qwen2-57b-a14b", 8}};
  for (const auto& [model, slots] : families) {
    const MoeSpec spec = shrunk_spec(model);
    ASSERT_EQ(spec.shared_slots(), slots) << model;
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 1234);
    for (int tokens : {1, 2, 7, 32, 128}) {
      SCOPED_TRACE(model + " T=" + std::to_string(tokens));
      const std::vector<Bf16> x = random_input(tokens, kHidden, 77 + tokens, 2.0f);
      const ForwardResult un = cpu_reference::forward(*w, x.data(), tokens, FuseShared::Off);
      const ForwardResult fu = cpu_reference::forward(*w, x.data(), tokens, FuseShared::On);
      EXPECT_FALSE(un.fused);
      EXPECT_TRUE(fu.fused);
      ASSERT_EQ(un.routing.slots, spec.top_k);
      ASSERT_EQ(fu.routing.slots, spec.top_k + slots);
      for (int t = 0; t < tokens; ++t) {
        for (int j = 0; j < spec.top_k; ++j) {
          ASSERT_EQ(fu.routing.ids[t * fu.routing.slots + j], un.routing.ids[t * spec.top_k + j]);
          ASSERT_EQ(fu.routing.weights[t * fu.routing.slots + j],
                    un.routing.weights[t * spec.top_k + j]);
        }
        for (int s = 0; s < slots; ++s)
          ASSERT_EQ(fu.routing.ids[t * fu.routing.slots + spec.top_k + s], kExperts + s);
      }
      ASSERT_EQ(un.y.size(), static_cast<size_t>(tokens * kHidden));
      const double scale = max_abs(un.y);
      ASSERT_GT(scale, 1e-2);
      double diff = 0;
      for (size_t i = 0; i < un.y.size(); ++i)
        diff = std::max(diff, std::fabs(static_cast<double>(un.y[i]) - fu.y[i]));
      EXPECT_LE(diff, 1e-5 * scale) << "max |fused - unfused| " << diff << " of max |y| " << scale;
    }
  }
}

// ---------------------------------------------------------------- assembly of the layer

// y = sum_slots w * E_id(x) + shared_scale * shared(x), assembled here from the public pieces.
void check_assembly(const std::string& model, int tokens) {
  SCOPED_TRACE(model);
  const MoeSpec spec = shrunk_spec(model);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 99);
  const std::vector<Bf16> x = random_input(tokens, kHidden, 5, 2.0f);
  const ForwardResult res = cpu_reference::forward(*w, x.data(), tokens, FuseShared::Off);
  const Routing& r = res.routing;
  std::vector<float> out(kHidden);
  double routed_only_diff = 0;
  for (int t = 0; t < tokens; ++t) {
    const Bf16* xt = x.data() + t * kHidden;
    std::vector<double> want(kHidden, 0.0);
    for (int j = 0; j < r.slots; ++j) {
      cpu_reference::expert_forward(spec, w->expert(r.ids[t * r.slots + j]), xt, out.data());
      for (int h = 0; h < kHidden; ++h) want[h] += r.weights[t * r.slots + j] * out[h];
    }
    const std::vector<double> routed = want;
    if (spec.shared_kind != SharedKind::None) {
      cpu_reference::shared_forward(*w, xt, out.data());
      for (int h = 0; h < kHidden; ++h) want[h] += r.shared_scale[t] * out[h];
    }
    for (int h = 0; h < kHidden; ++h) {
      EXPECT_NEAR(res.y[t * kHidden + h], want[h], 1e-5 * std::max(1.0, std::fabs(want[h])));
      routed_only_diff = std::max(routed_only_diff, std::fabs(want[h] - routed[h]));
    }
  }
  // The shared expert contributes (so fused == unfused above compares something real).
  if (spec.shared_kind != SharedKind::None) EXPECT_GT(routed_only_diff, 1e-3);
}

TEST(ReferenceLayer, OutputIsWeightedSumOfExpertsAndShared) {
  check_assembly("deepseek-v3", 9);     // plain shared, grouped sigmoid
  check_assembly("qwen2-57b-a14b", 9);  // gated shared, scale sigmoid(gate logit) per token
  check_assembly("gpt-oss-120b", 9);    // no shared; weights multiply the b2 bias too
  check_assembly("mixtral-8x7b", 9);
}

TEST(ReferenceLayer, GatedSharedScaleIsSigmoidOfGateRow) {
  const MoeSpec spec = shrunk_spec("qwen2-57b-a14b");
  ASSERT_EQ(spec.shared_kind, SharedKind::Gated);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 8);
  const int tokens = 4;
  const std::vector<Bf16> x = random_input(tokens, kHidden, 6, 2.0f);
  const ForwardResult res = cpu_reference::forward(*w, x.data(), tokens, FuseShared::Auto);
  EXPECT_TRUE(res.fused);
  const Bf16* gate_row = static_cast<const Bf16*>(w->router_weight()) + kExperts * kHidden;
  for (int t = 0; t < tokens; ++t) {
    double g = 0;
    for (int h = 0; h < kHidden; ++h)
      g += bf16_to_float(gate_row[h]) * bf16_to_float(x[t * kHidden + h]);
    const double want = 1.0 / (1.0 + std::exp(-g));
    EXPECT_NEAR(res.routing.shared_scale[t], want, 1e-6);
    for (int s = 0; s < 8; ++s)
      EXPECT_EQ(res.routing.weights[t * res.routing.slots + spec.top_k + s],
                res.routing.shared_scale[t]);
  }
}

// ---------------------------------------------------------------- modes and errors

TEST(ReferenceLayer, FuseModes) {
  const MoeSpec mixtral = shrunk_spec("mixtral-8x7b");
  const auto w = make_random_weights(mixtral, mixtral.moe_layers.front(), 1);
  const std::vector<Bf16> x = random_input(2, kHidden, 1, 1.0f);
  EXPECT_FALSE(cpu_reference::forward(*w, x.data(), 2, FuseShared::Auto).fused);
  expect_error([&] { cpu_reference::forward(*w, x.data(), 2, FuseShared::On); },
                    {"shared_intermediate", "expert_intermediate"});

  MoeSpec odd = shrunk_spec("deepseek-v3");
  odd.shared_intermediate = kInter + kInter / 2;  // 1.5 slots: cannot fuse
  const auto wo = make_random_weights(odd, odd.moe_layers.front(), 1);
  EXPECT_FALSE(cpu_reference::forward(*wo, x.data(), 2, FuseShared::Auto).fused);
  expect_error([&] { cpu_reference::forward(*wo, x.data(), 2, FuseShared::On); },
                    {"shared_intermediate (24)", "expert_intermediate (16)"});

  const MoeSpec dsv3 = shrunk_spec("deepseek-v3");
  const auto wd = make_random_weights(dsv3, dsv3.moe_layers.front(), 1);
  EXPECT_TRUE(cpu_reference::forward(*wd, x.data(), 2, FuseShared::Auto).fused);
  const ForwardResult empty = cpu_reference::forward(*wd, x.data(), 0, FuseShared::Auto);
  EXPECT_EQ(empty.tokens, 0);
  EXPECT_TRUE(empty.y.empty());
}

TEST(ReferenceLayer, TouchesOnlyRoutedExperts) {
  const MoeSpec spec = shrunk_spec("kimi-k2");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 2);
  const std::vector<Bf16> x = random_input(1, kHidden, 2, 1.0f);
  const ForwardResult res = cpu_reference::forward(*w, x.data(), 1, FuseShared::On);
  const std::set<int> distinct(res.routing.ids.begin(), res.routing.ids.end());
  EXPECT_EQ(w->materialised_experts(), static_cast<int>(distinct.size()));
}

TEST(ReferenceLayer, NonFiniteInputThrowsNamingTokenAndColumn) {
  std::vector<Bf16> x = random_input(3, kHidden, 4, 1.0f);
  x[2 * kHidden + 17] = float_to_bf16(std::nanf(""));
  expect_error([&] { check_finite_input(x.data(), 3, kHidden); }, {"token 2", "column 17"});
  const MoeSpec spec = shrunk_spec("glm-4.5");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 1);
  expect_error([&] { cpu_reference::forward(*w, x.data(), 3, FuseShared::Off); },
                    {"token 2", "column 17"});
  x[2 * kHidden + 17] = float_to_bf16(-INFINITY);
  x[0 * kHidden + 3] = float_to_bf16(INFINITY);
  expect_error([&] { check_finite_input(x.data(), 3, kHidden); }, {"token 0", "column 3"});
}

}  // namespace
}  // namespace moekit
