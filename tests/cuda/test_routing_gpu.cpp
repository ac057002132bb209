// The GPU routing + dispatch kernel alone (cuda::route_on_device) on constructed logits, every
// family of configs/ scaled down: exactly the CPU reference's ids (tie-free and all-tied logits;
// lower ids win ties on both sides), its weights to 1e-5, and the dispatch's invariants (a
// permutation of the pairs, tasks of at most `chunk` tokens of one expert, the task_more links).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/random_values.h"
#include "layer_test_util.h"
#include "moekit/cuda_layer.h"
#include "moekit/layer.h"
#include "moekit/routing.h"

namespace moekit {
namespace {

using namespace moekit::test;

// Tie-free logits: a per-token permutation of evenly spaced values (0.05 apart).
std::vector<float> tie_free_logits(int tokens, int cols, uint64_t seed) {
  std::vector<float> out(static_cast<size_t>(tokens) * cols);
  const uint64_t s = random_values::stream_key(seed, 0, random_values::Tensor::Input, 0);
  for (int t = 0; t < tokens; ++t) {
    std::vector<int> perm(cols);
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = cols - 1; i > 0; --i) {
      const uint64_t r = random_values::mix64(s ^ (static_cast<uint64_t>(t) * 1000003 + i));
      std::swap(perm[i], perm[r % (i + 1)]);
    }
    for (int e = 0; e < cols; ++e) out[static_cast<size_t>(t) * cols + e] = (perm[e] - cols / 2) * 0.05f;
  }
  return out;
}

void check_dispatch(const Routing& r, const cuda::GpuDispatch& d, int rows, int chunk,
                    const std::string& what) {
  const int pairs = r.tokens * r.slots;
  EXPECT_FALSE(d.id_out_of_range) << what;
  std::vector<int> sorted = d.pair_list;
  std::sort(sorted.begin(), sorted.end());
  for (int q = 0; q < pairs; ++q) ASSERT_EQ(sorted[q], q) << what << ": pair list is not a permutation";
  std::vector<int> count(rows, 0);
  for (int id : r.ids) count[id]++;
  int expect_tasks = 0;
  for (int n : count) expect_tasks += (n + chunk - 1) / chunk;
  EXPECT_EQ(d.num_tasks, expect_tasks) << what;
  int covered = 0;
  for (int i = 0; i < d.num_tasks; ++i) {
    EXPECT_GE(d.task_count[i], 1) << what;
    EXPECT_LE(d.task_count[i], chunk) << what;
    for (int j = 0; j < d.task_count[i]; ++j) {
      const int q = d.pair_list[d.task_begin[i] + j];
      ASSERT_EQ(r.ids[q], d.task_expert[i]) << what << ": task " << i << " holds pair " << q;
    }
    covered += d.task_count[i];
    const bool next_same = i + 1 < d.num_tasks && d.task_expert[i + 1] == d.task_expert[i];
    EXPECT_EQ(d.task_more[i], next_same ? 1 : 0) << what << ": task " << i;
  }
  EXPECT_EQ(covered, pairs) << what;
  EXPECT_EQ(d.num_shared_tasks, (r.tokens + chunk - 1) / chunk) << what;
}

TEST(GpuRouting, ExactIdsOnTieFreeAndTiedLogitsEveryFamily) {
  SKIP_WITHOUT_GPU();
  for (const auto& model : kModels) {
    for (const bool fused : {false, true}) {
      for (int experts : {32, 256}) {
        const MoeSpec spec = small_spec(model, 256, experts, 128);
        if (fused && !spec.can_fuse_shared()) continue;
        const RoutingConfig cfg = RoutingConfig::from_spec(spec, fused);
        for (int tokens : {1, 7, 300}) {
          std::ostringstream what;
          what << model << " E=" << experts << " fused=" << fused << " T=" << tokens;
          SCOPED_TRACE(what.str());
          std::vector<float> bias(spec.num_experts);
          for (int e = 0; e < spec.num_experts; ++e) bias[e] = ((e * 7) % 5) * 0.0625f;
          // tie-free
          std::vector<float> logits = tie_free_logits(tokens, cfg.logits_columns, tokens);
          for (const int chunk : {8, 16, 32}) {
            cuda::GpuDispatch d;
            const Routing g = cuda::route_on_device(cfg, logits.data(), tokens, bias.data(),
                                                    chunk, &d);
            const Routing c = cpu_reference::route(cfg, logits.data(), tokens, bias.data());
            ASSERT_EQ(g.ids, c.ids);
            for (size_t i = 0; i < c.weights.size(); ++i) {
              ASSERT_NEAR(g.weights[i], c.weights[i], 1e-5 * std::fabs(c.weights[i]) + 1e-7)
                  << "pair " << i;
            }
            EXPECT_EQ(g.shared_scale.size(), c.shared_scale.size());
            for (size_t t = 0; t < c.shared_scale.size(); ++t) {
              ASSERT_NEAR(g.shared_scale[t], c.shared_scale[t], 1e-6) << "token " << t;
            }
            check_dispatch(g, d, spec.num_experts + cfg.shared_slots, chunk, what.str());
          }
          // exact ties everywhere: three logit levels, lower id must win on both sides
          for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 3) * 0.5f;
          const Routing g = cuda::route_on_device(cfg, logits.data(), tokens, bias.data());
          const Routing c = cpu_reference::route(cfg, logits.data(), tokens, bias.data());
          ASSERT_EQ(g.ids, c.ids) << "tied logits";
        }
      }
    }
  }
}

TEST(GpuRouting, ExtremeBiasesKeepUnbiasedWeights) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("deepseek-v3", 256, 256, 128);
  const RoutingConfig cfg = RoutingConfig::from_spec(spec, true);
  const int tokens = 16;
  std::vector<float> logits = tie_free_logits(tokens, cfg.logits_columns, 3);
  for (float& v : logits) v = v * 4.0f - 18.0f;  // scores ~1e-8..1e-6
  std::vector<float> bias(spec.num_experts);
  for (int e = 0; e < spec.num_experts; ++e) bias[e] = (e % 2 ? 12.0f : -12.0f) + e * 1e-3f;
  const Routing g = cuda::route_on_device(cfg, logits.data(), tokens, bias.data());
  const Routing c = cpu_reference::route(cfg, logits.data(), tokens, bias.data());
  ASSERT_EQ(g.ids, c.ids);
  for (size_t i = 0; i < c.weights.size(); ++i) {
    EXPECT_GT(g.weights[i], 0.0f) << "pair " << i << ": weight from key - bias would be 0";
    EXPECT_NEAR(g.weights[i], c.weights[i], 1e-5 * std::fabs(c.weights[i])) << "pair " << i;
  }
}

}  // namespace
}  // namespace moekit
