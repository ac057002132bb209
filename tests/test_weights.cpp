// Random weights: deterministic, the documented formula (src/io/random_weight_values.h), lazy and
// thread-safe, fused shared slots equal to slices of the shared MLP; host-memory estimate.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <thread>

#include "common/random_values.h"
#include "io/random_weight_values.h"
#include "io_test_util.h"
#include "moekit/error.h"
#include "moekit/weights.h"

using moekit::Bf16;
using moekit::DType;
using moekit::LayerWeights;
using moekit::make_random_weights;
using moekit::MoeSpec;
using moekit::test::small_spec;
namespace rv = moekit::random_values;
using ::testing::HasSubstr;

namespace {

bool same_bits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

float bf(Bf16 v) { return moekit::bf16_to_float(v); }

int first_moe_layer(const MoeSpec& s) { return s.moe_layers.at(0); }

TEST(RandomWeights, DeterministicPerSeedAndLayer) {
  const MoeSpec s = small_spec("deepseek-v3");
  const int L = first_moe_layer(s);
  auto a = make_random_weights(s, L, 7);
  auto b = make_random_weights(s, L, 7);
  auto c = make_random_weights(s, L, 8);
  auto d = make_random_weights(s, s.moe_layers.at(1), 7);
  const size_t H = s.hidden, I = s.expert_intermediate;
  EXPECT_TRUE(same_bits(a->router_weight(), b->router_weight(), s.router_bytes()));
  EXPECT_FALSE(same_bits(a->router_weight(), c->router_weight(), s.router_bytes()));
  EXPECT_FALSE(same_bits(a->router_weight(), d->router_weight(), s.router_bytes()));
  for (int e : {0, 5, s.num_experts - 1}) {
    EXPECT_TRUE(same_bits(a->expert(e).w13, b->expert(e).w13, 2 * I * H * 2)) << e;
    EXPECT_TRUE(same_bits(a->expert(e).w2, b->expert(e).w2, H * I * 2)) << e;
    EXPECT_FALSE(same_bits(a->expert(e).w13, c->expert(e).w13, 2 * I * H * 2)) << e;
  }
  // Different experts of one layer differ.
  EXPECT_FALSE(same_bits(a->expert(0).w13, a->expert(1).w13, 2 * I * H * 2));
  EXPECT_EQ(a->origin(), "random seed 7");
}

TEST(RandomWeights, ValuesFollowTheDocumentedFormula) {
  const MoeSpec s = small_spec("deepseek-v3");
  const int L = first_moe_layer(s);
  const uint64_t seed = 1234;
  auto w = make_random_weights(s, L, seed);
  const size_t H = s.hidden, I = s.expert_intermediate, Is = s.shared_intermediate;
  const int e = 3;
  const auto ex = w->expert(e);
  const uint64_t k13 = rv::stream_key(seed, L, rv::Tensor::ExpertW13, e);
  const uint64_t k2 = rv::stream_key(seed, L, rv::Tensor::ExpertW2, e);
  for (size_t i : {size_t{0}, size_t{1}, H + 5, 2 * I * H - 1}) {
    EXPECT_EQ(bf(ex.w13[i]), moekit::round_to_bf16(rv::uniform(k13, i) * (1.0f / std::sqrt(64.0f))))
        << i;
  }
  for (size_t i : {size_t{0}, H * I - 1}) {
    EXPECT_EQ(bf(ex.w2[i]), moekit::round_to_bf16(rv::uniform(k2, i) * (1.0f / std::sqrt(32.0f))));
  }
  // Shared MLP: fan-in H for w13, Is for w2.
  const uint64_t ks2 = rv::stream_key(seed, L, rv::Tensor::SharedW2, -1);
  EXPECT_EQ(bf(w->shared_w2()[H * Is - 1]),
            moekit::round_to_bf16(rv::uniform(ks2, H * Is - 1) / std::sqrt(float(Is))));
  // Router rows (bf16), correction bias (fp32, unrounded, * 0.02).
  const uint64_t kr = rv::stream_key(seed, L, rv::Tensor::RouterWeight, -1);
  const Bf16* router = static_cast<const Bf16*>(w->router_weight());
  EXPECT_EQ(bf(router[7 * H + 3]), moekit::round_to_bf16(rv::uniform(kr, 7 * H + 3) * 0.125f));
  ASSERT_NE(w->correction_bias(), nullptr);
  const uint64_t kc = rv::stream_key(seed, L, rv::Tensor::CorrectionBias, -1);
  EXPECT_EQ(w->correction_bias()[9], rv::uniform(kc, 9) * 0.02f);
  EXPECT_EQ(w->router_bias(), nullptr);
  EXPECT_EQ(ex.b13, nullptr);
  // O(1)-preserving scale: |w| < 1/sqrt(fan_in) (rounding can reach it, never exceed by more).
  for (size_t i = 0; i < 2 * I * H; ++i) ASSERT_LE(std::fabs(bf(ex.w13[i])), 0.1251f);
}

TEST(RandomWeights, Fp32RouterIsNotRounded) {
  const MoeSpec s = small_spec("minimax-m2");
  ASSERT_EQ(s.router_dtype, DType::F32);
  const int L = first_moe_layer(s);
  auto w = make_random_weights(s, L, 3);
  const float* router = static_cast<const float*>(w->router_weight());
  const uint64_t kr = rv::stream_key(3, L, rv::Tensor::RouterWeight, -1);
  int not_bf16 = 0;
  for (size_t i = 0; i < size_t(s.num_experts) * s.hidden; ++i) {
    ASSERT_EQ(router[i], rv::uniform(kr, i) * rv::weight_scale(s.hidden));
    not_bf16 += router[i] != moekit::round_to_bf16(router[i]);
  }
  EXPECT_GT(not_bf16, s.num_experts * s.hidden / 2);
}

TEST(RandomWeights, GptOssBiases) {
  const MoeSpec s = small_spec("gpt-oss-120b");
  const int L = first_moe_layer(s);
  auto w = make_random_weights(s, L, 5);
  ASSERT_NE(w->router_bias(), nullptr);
  EXPECT_EQ(w->router_bias()[2],
            rv::uniform(rv::stream_key(5, L, rv::Tensor::RouterBias, -1), 2) * 0.1f);
  const auto ex = w->expert(4);
  ASSERT_NE(ex.b13, nullptr);
  ASSERT_NE(ex.b2, nullptr);
  EXPECT_EQ(
      ex.b13[2 * s.expert_intermediate - 1],
      rv::uniform(rv::stream_key(5, L, rv::Tensor::ExpertB13, 4), 2 * s.expert_intermediate - 1) *
          0.1f);
  EXPECT_EQ(ex.b2[s.hidden - 1],
            rv::uniform(rv::stream_key(5, L, rv::Tensor::ExpertB2, 4), s.hidden - 1) * 0.1f);
}

TEST(RandomWeights, GatedSharedRouterRowContinuesTheStream) {
  const MoeSpec s = small_spec("qwen2-57b-a14b");
  ASSERT_EQ(s.router_columns(), s.num_experts + 1);
  const int L = first_moe_layer(s);
  auto w = make_random_weights(s, L, 11);
  const Bf16* router = static_cast<const Bf16*>(w->router_weight());
  const uint64_t kr = rv::stream_key(11, L, rv::Tensor::RouterWeight, -1);
  const size_t gate_row = size_t(s.num_experts) * s.hidden;
  for (size_t c = 0; c < size_t(s.hidden); ++c) {
    ASSERT_EQ(bf(router[gate_row + c]),
              moekit::round_to_bf16(rv::uniform(kr, gate_row + c) * rv::weight_scale(s.hidden)));
  }
}

TEST(RandomWeights, ExpertsAreLazyAndStable) {
  const MoeSpec s = small_spec("qwen3-30b-a3b");
  auto w = make_random_weights(s, first_moe_layer(s), 0);
  EXPECT_EQ(w->materialised_experts(), 0);
  const auto first = w->expert(5);
  EXPECT_EQ(w->materialised_experts(), 1);
  const auto again = w->expert(5);
  EXPECT_EQ(first.w13, again.w13);
  EXPECT_EQ(first.w2, again.w2);
  EXPECT_EQ(w->materialised_experts(), 1);
  w->prefetch({1, 2, 3, 5, 2});
  EXPECT_EQ(w->materialised_experts(), 4);
  EXPECT_EQ(w->expert(5).w13, first.w13);
  try {
    w->expert(s.num_experts);  // no shared expert, so no fused slots
    FAIL() << "expected an error";
  } catch (const moekit::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("expected 0 <= e < 16, got 16"));
  }
  EXPECT_THROW(w->prefetch({0, -1}), moekit::Error);
}

TEST(RandomWeights, ConcurrentFirstUseBuildsEachExpertOnce) {
  const MoeSpec s = small_spec("deepseek-v3");
  auto w = make_random_weights(s, first_moe_layer(s), 9);
  std::vector<std::thread> threads;
  std::vector<std::vector<const Bf16*>> seen(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int e = 0; e < s.num_experts + s.shared_slots(); ++e)
        seen[t].push_back(w->expert((e + 3 * t) % (s.num_experts + s.shared_slots())).w13);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(w->materialised_experts(), s.num_experts + s.shared_slots());
  std::set<const Bf16*> distinct;
  for (auto& v : seen) distinct.insert(v.begin(), v.end());
  EXPECT_EQ(distinct.size(), size_t(s.num_experts + s.shared_slots()));
}

// Fused slot j == gate/up rows [jI,(j+1)I) and down columns [jI,(j+1)I) of the shared MLP.
void expect_slots_are_slices(const MoeSpec& s) {
  ASSERT_GT(s.shared_slots(), 0) << s.name;
  auto w = make_random_weights(s, first_moe_layer(s), 21);
  const size_t H = s.hidden, I = s.expert_intermediate, Is = s.shared_intermediate;
  for (int j = 0; j < s.shared_slots(); ++j) {
    const auto ex = w->expert(s.num_experts + j);
    for (size_t r = 0; r < I; ++r) {
      for (size_t c = 0; c < H; ++c) {
        ASSERT_EQ(ex.w13[r * H + c].bits, w->shared_w13()[(j * I + r) * H + c].bits);
        ASSERT_EQ(ex.w13[(I + r) * H + c].bits, w->shared_w13()[(Is + j * I + r) * H + c].bits);
        ASSERT_EQ(ex.w2[c * I + r].bits, w->shared_w2()[c * Is + j * I + r].bits);
      }
    }
  }
  EXPECT_EQ(w->materialised_experts(), s.shared_slots());
}

TEST(RandomWeights, FusedSlotsAreSlicesOfTheSharedMlp) {
  expect_slots_are_slices(small_spec("deepseek-v2-lite"));  // 2 slots
  expect_slots_are_slices(small_spec("qwen2-57b-a14b"));    // gated, 2 slots
  expect_slots_are_slices(small_spec("minimax-m3"));        // 1 slot
}

TEST(RandomWeights, RejectsDenseLayer) {
  const MoeSpec s = small_spec("deepseek-v3");
  ASSERT_FALSE(s.is_moe_layer(0));
  try {
    make_random_weights(s, 0, 1);
    FAIL() << "expected an error";
  } catch (const moekit::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("layer 0 of deepseek-v3-small is not an MoE layer"));
  }
}

TEST(HostMemory, EstimateAndRefusal) {
  MoeSpec s = small_spec("deepseek-v3");
  const size_t base = s.router_bytes() + s.shared_bytes() + 2 * size_t(s.num_experts) * 4;
  EXPECT_EQ(moekit::host_bytes_needed(s, 1, false), base + 8 * s.expert_bytes());
  EXPECT_EQ(moekit::host_bytes_needed(s, 1, true), base + 9 * s.expert_bytes());
  EXPECT_EQ(moekit::host_bytes_needed(s, 1000, false), base + 16 * s.expert_bytes());
  EXPECT_NO_THROW(moekit::check_host_memory(s, 1000, true));
  // A petabyte-sized layer cannot fit anywhere.
  s.hidden = 1 << 20;
  s.expert_intermediate = 1 << 20;
  s.num_experts = 1024;
  try {
    moekit::check_host_memory(s, 1000, false);
    FAIL() << "expected an error";
  } catch (const moekit::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("GB of host memory for deepseek-v3-small"));
    EXPECT_THAT(e.what(), HasSubstr("GB available"));
  }
}

}  // namespace
