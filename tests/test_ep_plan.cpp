// Expert-parallel planning (moekit/ep.h) on synthetic routings: placement ranges and replica
// choice, the dispatch plan's invariants (each row once per destination, pairs by (token, slot),
// the combine map a bijection back onto (token, slot)), shared-slot locality, and the receive
// layouts of both modes with their capacity errors.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "expect_error.h"
#include "moekit/ep.h"

namespace moekit::ep {
namespace {

using test::expect_error;

// A routing of `tokens` tokens over E experts, k routed slots (distinct ids per token) then S
// fused slots E..E+S-1; weights encode (token, slot) so misplaced pairs show.
Routing synthetic_routing(int tokens, int E, int k, int S, uint32_t seed) {
  Routing r;
  r.tokens = tokens;
  r.slots = k + S;
  uint32_t state = seed * 2654435761u + 1;
  for (int t = 0; t < tokens; ++t) {
    std::set<int> picked;
    while (static_cast<int>(picked.size()) < k) {
      state = state * 1664525u + 1013904223u;
      const int e = static_cast<int>((state >> 8) % E);
      if (picked.insert(e).second) r.ids.push_back(e);
    }
    for (int j = 0; j < S; ++j) r.ids.push_back(E + j);
    for (int s = 0; s < k + S; ++s) r.weights.push_back(static_cast<float>(t * 100 + s));
  }
  return r;
}

TEST(EpPlacement, ContiguousRangesCoverEveryExpertOnce) {
  const Placement p = Placement::contiguous(10, 3);
  EXPECT_EQ(p.local_experts(0), 4);
  EXPECT_EQ(p.local_experts(1), 3);
  EXPECT_EQ(p.local_experts(2), 3);
  EXPECT_EQ(p.contiguous_first(0), 0);
  EXPECT_EQ(p.contiguous_first(1), 4);
  EXPECT_EQ(p.contiguous_first(2), 7);
  EXPECT_EQ(p.describe(), "E=10 W=3 ranks [0,4) [4,7) [7,10)");
  for (int e = 0; e < 10; ++e) ASSERT_EQ(p.replicas(e).size(), 1u) << e;
  EXPECT_EQ(p.replicas(5)[0], (Replica{1, 1}));
}

TEST(EpPlacement, MoreRanksThanExpertsLeavesRanksEmpty) {
  const Placement p = Placement::contiguous(3, 5);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(p.local_experts(r), 1);
  EXPECT_EQ(p.local_experts(3), 0);
  EXPECT_EQ(p.local_experts(4), 0);
  // a shared slot still runs at home, after the (zero) routed rows
  EXPECT_EQ(p.place(3, 4, 0, 1), (Replica{4, 0}));
}

TEST(EpPlacement, ReplicasPreferTheSourceThenSpreadByToken) {
  // expert 0 on ranks 0 and 2, expert 1 on rank 1 only, expert 2 on ranks 1 and 2
  const Placement p = Placement::from_map(3, {{0}, {1, 2}, {2, 0}});
  EXPECT_EQ(p.contiguous_first(2), -1);
  EXPECT_EQ(p.describe(), "E=3 W=3 ranks [0,1) [1,3) {2,0}");
  EXPECT_EQ(p.place(0, 2, 7, 0), (Replica{2, 1}));  // the source holds a copy
  EXPECT_EQ(p.place(0, 1, 0, 0), (Replica{0, 0}));  // token 0 -> first copy
  EXPECT_EQ(p.place(0, 1, 1, 0), (Replica{2, 1}));  // token 1 -> second copy
  EXPECT_EQ(p.place(2, 0, 3, 0), (Replica{2, 0}));
  EXPECT_EQ(p.place(3, 1, 0, 2), (Replica{1, 2}));  // fused slot 0 of rank 1
  EXPECT_EQ(p.place(4, 1, 0, 2), (Replica{1, 3}));
}

TEST(EpPlacement, BadMapsNameTheProblem) {
  expect_error([] { Placement::from_map(3, {{0, 1}, {1}}); }, {"expert 2", "none of the 2 ranks"});
  expect_error([] { Placement::from_map(3, {{0, 1, 2, 1}}); }, {"rank 0 holds expert 1 twice"});
  expect_error([] { Placement::from_map(3, {{0, 1, 3}}); }, {"holds expert 3", "[0, 3)"});
  expect_error([] { Placement::contiguous(4, 0); }, {"world_size > 0", "got 0"});
  const Placement p = Placement::contiguous(4, 2);
  expect_error([&] { p.place(5, 0, 2, 1); }, {"token 2 of rank 0", "expert 5", "[0, 5)"});
  expect_error([] { parse_mode("fast"); }, {"'fast'", "throughput or low-latency"});
}

// The invariants every plan keeps, whatever the placement and routing.
void check_plan(const Placement& p, int src, const Routing& r, int S, const DispatchPlan& plan) {
  const int W = p.world_size(), E = p.num_experts();
  ASSERT_EQ(plan.row_begin.size(), static_cast<size_t>(W + 1));
  ASSERT_EQ(plan.combine_pair.size(), r.ids.size());
  std::vector<int> hits(plan.pairs.size(), 0);
  for (int t = 0; t < r.tokens; ++t) {
    for (int s = 0; s < r.slots; ++s) {
      const size_t i = static_cast<size_t>(t) * r.slots + s;
      const int pi = plan.combine_pair[i];
      ASSERT_GE(pi, 0);
      ASSERT_LT(pi, static_cast<int>(plan.pairs.size()));
      ++hits[pi];
      const Pair& pair = plan.pairs[pi];
      const int d = plan.destination_of(pi);
      EXPECT_EQ(pair.slot, s);
      EXPECT_EQ(pair.weight, r.weights[i]);
      // the row the pair names is this token's
      ASSERT_LT(pair.row, plan.rows_to(d));
      EXPECT_EQ(plan.rows[plan.row_begin[d] + pair.row], t);
      const int id = r.ids[i];
      if (id >= E) {
        // shared-slot locality: a fused slot never crosses ranks
        EXPECT_EQ(d, src) << "token " << t << " slot " << s;
        EXPECT_EQ(pair.local_expert, p.local_experts(src) + (id - E));
      } else {
        EXPECT_EQ(p.experts_of(d).at(pair.local_expert), id);
      }
    }
  }
  for (int h : hits) EXPECT_EQ(h, 1);  // the combine map is a bijection
  for (int d = 0; d < W; ++d) {
    // rows strictly ascending (each token once), pairs by (token, slot)
    for (int j = plan.row_begin[d] + 1; j < plan.row_begin[d + 1]; ++j)
      EXPECT_LT(plan.rows[j - 1], plan.rows[j]);
    for (int j = plan.pair_begin[d] + 1; j < plan.pair_begin[d + 1]; ++j) {
      const Pair &a = plan.pairs[j - 1], &b = plan.pairs[j];
      EXPECT_TRUE(a.row < b.row || (a.row == b.row && a.slot < b.slot)) << "rank " << d << " " << j;
    }
  }
  EXPECT_LE(plan.remote_pairs(), static_cast<int64_t>(r.tokens) * (r.slots - S));
}

TEST(EpDispatchPlan, InvariantsForEveryWorldSize) {
  const int E = 32, k = 8, S = 1, T = 13;
  for (int W = 1; W <= 8; ++W) {
    const Placement p = Placement::contiguous(E, W);
    for (int src = 0; src < W; ++src) {
      SCOPED_TRACE("W=" + std::to_string(W) + " src=" + std::to_string(src));
      const Routing r = synthetic_routing(T, E, k, S, 17 * W + src);
      const DispatchPlan plan = plan_dispatch(p, src, r, S);
      check_plan(p, src, r, S, plan);
      if (W == 1) {
        EXPECT_EQ(plan.remote_pairs(), 0);
      }
    }
  }
}

TEST(EpDispatchPlan, ReplicaMapInvariants) {
  const Placement p = Placement::from_map(6, {{0, 1, 2}, {3, 4, 5, 0}, {1, 4}});
  for (int src = 0; src < 3; ++src) {
    const Routing r = synthetic_routing(9, 6, 3, 2, src + 5);
    check_plan(p, src, r, 2, plan_dispatch(p, src, r, 2));
  }
}

TEST(EpDispatchPlan, HandCheckedSmallCase) {
  // E = 4 over 2 ranks ([0,2) [2,4)), k = 2, one fused slot; rank 1's two tokens
  const Placement p = Placement::contiguous(4, 2);
  Routing r;
  r.tokens = 2;
  r.slots = 3;
  r.ids = {3, 0, 4, /**/ 1, 0, 4};
  r.weights = {0.5f, 0.25f, 1.0f, /**/ 0.75f, 0.125f, 1.0f};
  const DispatchPlan plan = plan_dispatch(p, 1, r, 1);
  EXPECT_EQ(plan.row_begin, (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(plan.rows, (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_EQ(plan.pair_begin, (std::vector<int32_t>{0, 3, 6}));
  const std::vector<Pair> want = {
      {0, 1, 0, 0.25f}, {1, 0, 1, 0.75f}, {1, 1, 0, 0.125f},  // to rank 0
      {0, 0, 1, 0.5f},  {0, 2, 2, 1.0f},  {1, 2, 2, 1.0f},    // to rank 1 (home)
  };
  EXPECT_EQ(plan.pairs, want);
  EXPECT_EQ(plan.combine_pair, (std::vector<int32_t>{3, 0, 4, 1, 2, 5}));
  EXPECT_EQ(plan.remote_rows(), 2);
  EXPECT_EQ(plan.remote_pairs(), 3);
}

TEST(EpDispatchPlan, EmptyRankAndRankReceivingEverything) {
  // rank 0 holds every expert; rank 2 has no tokens
  const Placement p = Placement::from_map(8, {{0, 1, 2, 3, 4, 5, 6, 7}, {}, {}});
  std::vector<DispatchPlan> plans;
  const std::vector<int> tokens = {5, 4, 0};
  for (int src = 0; src < 3; ++src) {
    const Routing r = synthetic_routing(tokens[src], 8, 2, 0, src);
    plans.push_back(plan_dispatch(p, src, r, 0));
    check_plan(p, src, r, 0, plans.back());
  }
  EXPECT_TRUE(plans[2].rows.empty());
  EXPECT_TRUE(plans[2].pairs.empty());
  const ExchangeConfig cfg{Mode::Throughput, 0, 2};
  const std::vector<ReceiveLayout> recv = plan_receives(plans, cfg);
  EXPECT_EQ(recv[0].rows_from, (std::vector<int32_t>{5, 4, 0}));
  EXPECT_EQ(recv[0].pairs_from, (std::vector<int32_t>{10, 8, 0}));
  EXPECT_EQ(recv[0].row_offset, (std::vector<int32_t>{0, 5, 9}));
  EXPECT_EQ(recv[0].buffer_rows, 9);
  EXPECT_EQ(recv[1].total_pairs(), 0);
  EXPECT_EQ(recv[2].buffer_pairs, 0);
}

TEST(EpReceiveLayout, ThroughputPacksLowLatencyUsesFixedBlocks) {
  const std::vector<int32_t> rows = {3, 0, 2}, pairs = {5, 0, 6};
  const ReceiveLayout tp = plan_receive(1, rows, pairs, {Mode::Throughput, 0, 3});
  EXPECT_EQ(tp.row_offset, (std::vector<int32_t>{0, 3, 3}));
  EXPECT_EQ(tp.pair_offset, (std::vector<int32_t>{0, 5, 5}));
  EXPECT_EQ(tp.buffer_rows, 5);
  EXPECT_EQ(tp.buffer_pairs, 11);
  const ExchangeConfig ll{Mode::LowLatency, 4, 3};
  EXPECT_EQ(low_latency_capacity(ll).rows, 4);
  EXPECT_EQ(low_latency_capacity(ll).pairs, 12);
  const ReceiveLayout lay = plan_receive(1, rows, pairs, ll);
  EXPECT_EQ(lay.row_offset, (std::vector<int32_t>{0, 4, 8}));
  EXPECT_EQ(lay.pair_offset, (std::vector<int32_t>{0, 12, 24}));
  EXPECT_EQ(lay.buffer_rows, 12);
  EXPECT_EQ(lay.buffer_pairs, 36);
  EXPECT_EQ(lay.total_rows(), 5);
}

TEST(EpReceiveLayout, LowLatencyCapacityErrors) {
  expect_error(
      [] {
        plan_receive(0, {5, 1}, {5, 1}, {Mode::LowLatency, 4, 2});
      },
      {"rank 0 gets 5 rows", "from rank 0", "capacity 4 rows and 8 pairs"});
  expect_error(
      [] {
        low_latency_capacity({Mode::LowLatency, 0, 2});
      },
      {"max_tokens_per_rank > 0", "got 0"});
  // a source over max_tokens_per_rank is refused before anything is sent
  const Placement p = Placement::contiguous(8, 2);
  const Routing r = synthetic_routing(9, 8, 2, 0, 3);
  const DispatchPlan plan = plan_dispatch(p, 1, r, 0);
  EXPECT_NO_THROW(check_capacity(plan, {Mode::Throughput, 8, 2}));
  EXPECT_NO_THROW(check_capacity(plan, {Mode::LowLatency, 9, 2}));
  expect_error(
      [&] {
        check_capacity(plan, {Mode::LowLatency, 8, 2});
      },
      {"rank 1 routes 9 tokens", "max_tokens_per_rank 8"});
}

}  // namespace
}  // namespace moekit::ep
