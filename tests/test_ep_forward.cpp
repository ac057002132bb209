// The expert-parallel forward simulated on the CPU (moekit/ep_cpu.h) against the single-rank CPU
// reference layer on the same tokens: expert ids, weights and y bitwise (the combine sums each
// token's outputs in the reference's slot order), for world sizes 1-8, both exchange modes and
// the families of DESIGN.md §5 at scaled-down shapes; shared-slot locality, empty ranks, a rank
// receiving every token, replicas, and the errors of low-latency capacity and mismatched views.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ep_test_util.h"
#include "expect_error.h"
#include "moekit/ep.h"
#include "moekit/ep_cpu.h"
#include "moekit/layer.h"
#include "moekit/weights.h"
#include "shrunk_spec.h"

namespace moekit::ep {
namespace {

using test::expect_error;

constexpr int kHidden = 64;
constexpr int kInter = 16;

// Token counts per rank: uneven, rank 1 empty whenever there are two or more ranks.
std::vector<int> token_split(int world) {
  std::vector<int> n(world);
  for (int r = 0; r < world; ++r) n[r] = (world > 1 && r == 1) ? 0 : 3 + (7 * r) % 5;
  return n;
}

struct Case {
  std::string model;
  int experts = 16;
  FuseShared fuse = FuseShared::Auto;
};

// The ranks' stacks, views and token blocks over one x, and the reference on all of x.
struct EpSetup {
  MoeSpec spec;
  std::unique_ptr<LayerWeights> lw;
  std::vector<Bf16> x;
  std::vector<int> split;
  std::vector<test::RankStacks> stacks;
  std::vector<MoeWeightsView> views;
  std::vector<RankTokens> blocks;
  ForwardResult ref;
};

EpSetup make_setup(const Case& c, const Placement& p, const std::vector<int>& split) {
  EpSetup s;
  s.spec = test::shrunk_spec(c.model, kHidden, kInter, c.experts);
  s.lw = make_random_weights(s.spec, s.spec.moe_layers.front(), 7);
  s.split = split;
  int total = 0;
  for (int n : split) total += n;
  s.x = test::random_input(total, kHidden, 11, 1.0f);
  s.ref = cpu_reference::forward(*s.lw, s.x.data(), total, c.fuse);
  const bool fused = s.ref.fused;
  for (int r = 0; r < p.world_size(); ++r) {
    s.stacks.push_back(test::rank_stacks(*s.lw, p.experts_of(r), fused, !fused));
  }
  int first = 0;
  for (int r = 0; r < p.world_size(); ++r) {
    s.views.push_back(s.stacks[r].view);
    s.blocks.push_back({s.x.data() + static_cast<size_t>(first) * kHidden, split[r]});
    first += split[r];
  }
  return s;
}

// Every rank's ids, weights and y equal the reference's rows for its tokens, bit for bit; every
// fused shared slot ran on its own rank.
void expect_equal_to_reference(const EpSetup& s, const std::vector<RankResult>& res) {
  const int H = kHidden;
  int first = 0;
  for (int r = 0; r < static_cast<int>(res.size()); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Routing& got = res[r].forward.routing;
    const int slots = s.ref.routing.slots;
    ASSERT_EQ(got.slots, slots);
    ASSERT_EQ(got.tokens, s.split[r]);
    EXPECT_EQ(res[r].forward.fused, s.ref.fused);
    const size_t n = static_cast<size_t>(s.split[r]) * slots;
    const size_t o = static_cast<size_t>(first) * slots;
    EXPECT_TRUE(std::equal(got.ids.begin(), got.ids.end(), s.ref.routing.ids.begin() + o));
    EXPECT_TRUE(
        std::equal(got.weights.begin(), got.weights.end(), s.ref.routing.weights.begin() + o));
    ASSERT_EQ(got.ids.size(), n);
    const std::vector<float>& y = res[r].forward.y;
    ASSERT_EQ(y.size(), static_cast<size_t>(s.split[r]) * H);
    int mismatches = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      const float want = s.ref.y[static_cast<size_t>(first) * H + i];
      if (y[i] != want && ++mismatches <= 3) {
        ADD_FAILURE() << "y[token " << i / H << ", col " << i % H << "] = " << y[i]
                      << ", reference " << want;
      }
    }
    EXPECT_EQ(mismatches, 0);
    // shared-slot locality: slots k .. slots-1 (the fused ones) never leave the rank
    const DispatchPlan& plan = res[r].dispatch;
    for (int t = 0; t < plan.tokens; ++t) {
      for (int j = s.spec.top_k; j < plan.slots; ++j) {
        EXPECT_EQ(plan.destination_of(plan.combine_pair[static_cast<size_t>(t) * plan.slots + j]),
                  r)
            << "token " << t << " slot " << j;
      }
    }
    first += s.split[r];
  }
}

int max_tokens(const std::vector<int>& split) {
  return std::max(1, *std::max_element(split.begin(), split.end()));
}

void run_world_sizes(const Case& c) {
  for (int W = 1; W <= 8; ++W) {
    for (Mode mode : {Mode::Throughput, Mode::LowLatency}) {
      SCOPED_TRACE(c.model + " W=" + std::to_string(W) + " " + mode_name(mode));
      const Placement p = Placement::contiguous(c.experts, W);
      const EpSetup s = make_setup(c, p, token_split(W));
      const SimOptions o{mode, max_tokens(s.split), c.fuse};
      const std::vector<RankResult> res = simulated_forward(s.spec, p, s.views, s.blocks, o);
      expect_equal_to_reference(s, res);
      if (W == 1) {
        EXPECT_EQ(res[0].remote_bytes_dispatch, 0);
        EXPECT_EQ(res[0].remote_bytes_combine, 0);
      }
      if (::testing::Test::HasFailure()) return;  // one world size's report is enough
    }
  }
}

// DeepSeek-V3: sigmoid + correction bias, 8 groups of 4 keeping 4, k = 8, one fused shared slot.
TEST(EpForward, DeepSeekV3FusedSharedEveryWorldSize) { run_world_sizes({"deepseek-v3", 32}); }
TEST(EpForward, DeepSeekV3UnfusedSharedEveryWorldSize) {
  run_world_sizes({"deepseek-v3", 32, FuseShared::Off});
}
TEST(EpForward, Qwen3MoeEveryWorldSize) { run_world_sizes({"qwen3-30b-a3b", 16}); }
TEST(EpForward, MixtralEveryWorldSize) { run_world_sizes({"mixtral-8x7b", 8}); }
TEST(EpForward, GptOssEveryWorldSize) { run_world_sizes({"gpt-oss-120b", 16}); }
// Qwen2-MoE: a gated shared expert of 8 fused slots, the gate in the slots' weights.
TEST(EpForward, Qwen2GatedSharedEveryWorldSize) { run_world_sizes({"qwen2-57b-a14b", 16}); }

TEST(EpForward, ReplicatedExpertsSpreadAndStayExact) {
  // 16 experts over 3 ranks, experts 0-5 on two ranks each
  const Placement p = Placement::from_map(
      16, {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 0, 1, 2}, {12, 13, 14, 15, 3, 4, 5}});
  const Case c{"deepseek-v3", 16};
  const EpSetup s = make_setup(c, p, {5, 6, 4});
  for (Mode mode : {Mode::Throughput, Mode::LowLatency}) {
    const std::vector<RankResult> res =
        simulated_forward(s.spec, p, s.views, s.blocks, {mode, 6, c.fuse});
    expect_equal_to_reference(s, res);
  }
}

TEST(EpForward, OneRankReceivesEveryToken) {
  // rank 0 holds every routed expert: every token of every rank goes there, at exactly the
  // low-latency capacity (max_tokens_per_rank = the largest rank's tokens)
  const Case c{"deepseek-v3", 32};
  std::vector<int> all(32);
  for (int e = 0; e < 32; ++e) all[e] = e;
  const Placement p = Placement::from_map(32, {all, {}, {}, {}});
  const EpSetup s = make_setup(c, p, {4, 6, 0, 6});
  for (Mode mode : {Mode::Throughput, Mode::LowLatency}) {
    const std::vector<RankResult> res =
        simulated_forward(s.spec, p, s.views, s.blocks, {mode, 6, c.fuse});
    expect_equal_to_reference(s, res);
    const ReceiveLayout& hub = res[0].receive;
    const int k = s.spec.top_k, slots = s.ref.routing.slots;
    EXPECT_EQ(hub.rows_from, (std::vector<int32_t>{4, 6, 0, 6}));
    EXPECT_EQ(hub.pairs_from, (std::vector<int32_t>{4 * slots, 6 * k, 0, 6 * k}));
    for (int r = 1; r < 4; ++r) {
      EXPECT_EQ(res[r].receive.total_rows(), s.split[r]) << r;  // its own shared slots
      EXPECT_EQ(res[r].dispatch.remote_rows(), s.split[r]);
    }
    EXPECT_EQ(res[1].remote_bytes_dispatch,
              6 * kHidden * 2 + 6 * k * static_cast<int64_t>(3 * sizeof(int32_t) + sizeof(float)));
    EXPECT_EQ(res[0].remote_bytes_combine, (6 + 0 + 6) * k * kHidden * 2);
  }
}

TEST(EpForward, AllRanksEmpty) {
  const Placement p = Placement::contiguous(16, 4);
  const EpSetup s = make_setup({"qwen3-30b-a3b", 16}, p, {0, 0, 0, 0});
  const std::vector<RankResult> res =
      simulated_forward(s.spec, p, s.views, s.blocks, {Mode::LowLatency, 1});
  for (const RankResult& r : res) {
    EXPECT_TRUE(r.forward.y.empty());
    EXPECT_EQ(r.receive.total_pairs(), 0);
  }
}

TEST(EpForward, LowLatencyCapacityOverflowIsAnError) {
  const Placement p = Placement::contiguous(16, 3);
  const EpSetup s = make_setup({"mixtral-8x7b", 16}, p, {3, 7, 2});
  expect_error(
      [&] {
        simulated_forward(s.spec, p, s.views, s.blocks, {Mode::LowLatency, 6});
      },
      {"rank 1 routes 7 tokens", "max_tokens_per_rank 6", "throughput"});
  expect_error(
      [&] {
        simulated_forward(s.spec, p, s.views, s.blocks, {Mode::LowLatency, 0});
      },
      {"max_tokens_per_rank > 0"});
  // the throughput mode takes any count
  expect_equal_to_reference(s, simulated_forward(s.spec, p, s.views, s.blocks, {}));
}

TEST(EpForward, MismatchedViewsNameTheRank) {
  const Placement p = Placement::contiguous(32, 2);
  EpSetup s = make_setup({"deepseek-v3", 32}, p, {2, 2});
  std::vector<MoeWeightsView> views = s.views;
  views[1].expert_count = 15;
  expect_error([&] { simulated_forward(s.spec, p, views, s.blocks); },
               {"rank 1's view holds 15 routed experts", "gives it 16"});
  views = s.views;
  views[0].fused_slots = 0;
  expect_error([&] { simulated_forward(s.spec, p, views, s.blocks); }, {"rank 0", "fused slots"});
  expect_error([&] { simulated_forward(s.spec, p, s.views, {s.blocks[0]}); },
               {"each of the 2 ranks", "1 blocks"});
  // fusion off needs the unfused shared MLP on every rank
  expect_error(
      [&] {
        simulated_forward(s.spec, p, s.views, s.blocks, {Mode::Throughput, 0, FuseShared::Off});
      },
      {"rank 0", "shared_w13"});
}

}  // namespace
}  // namespace moekit::ep
