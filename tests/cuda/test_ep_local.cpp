// Expert parallelism with both ranks on one GPU (moekit/ep_local.h: the dispatch and combine
// kernels, cudaMemcpyAsync as the transport) against the single-GPU layer (MoeOp::forward on the
// whole view over all the tokens): each rank's routing ids (ulp ties aside), its y to the bf16
// rounding of the ranks' partial sums (relative error by norm <= 1e-2, the tolerance of the engine
// API's slice test), for world size 2 and 4, both modes, the families of the engine API's tests;
// empty ranks; the rows sent match the CPU dispatch plan (moekit/ep.h) of the same routing.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "../engine_test_util.h"
#include "../expect_error.h"
#include "engine_gpu_test_util.h"
#include "layer_test_util.h"
#include "moekit/ep.h"
#include "moekit/ep_local.h"
#include "moekit/layer.h"

namespace moekit::test {
namespace {

const std::vector<std::string> kEpModels = {"deepseek-v3", "qwen2-57b-a14b", "gpt-oss-120b",
                                            "qwen3-30b-a3b", "mixtral-8x7b"};

struct EpCase {
  int world = 2;
  std::vector<int> split;  // tokens per rank
};

void run_case(const std::string& model, const EpCase& c, ep::Mode mode) {
  const MoeSpec spec = small_spec(model);  // H 256, 32 experts, I 128
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 21);
  const int H = spec.hidden, k = spec.top_k, W = c.world;
  int total = 0, most = 1;
  for (int n : c.split) total += n, most = std::max(most, n);
  const std::string what =
      model + " W=" + std::to_string(W) + " " + ep::mode_name(mode) + " T=" + std::to_string(total);
  SCOPED_TRACE(what);

  // the single-GPU layer on all the tokens
  const std::vector<Bf16> x = random_x(std::max(total, 1), H, 300 + total);
  const size_t bytes = static_cast<size_t>(total) * H * sizeof(Bf16);
  Dev dx(bytes, x.data()), dy(bytes), di(static_cast<size_t>(total) * k * 4),
      dw(static_cast<size_t>(total) * k * 4);
  const DeviceStacks whole(make_stacks(*lw));
  Engine eng(spec, engine_options(std::max(total, 1), FuseShared::Auto));
  if (total > 0) {
    eng.op.forward(whole.view, dx.p, dy.p, total, eng.ws->p, eng.ws->bytes, nullptr);
    eng.op.route(whole.view, dx.p, total, di.as<int32_t>(), dw.as<float>(), nullptr, eng.ws->p,
                 eng.ws->bytes, nullptr);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> y_ref = dy.to_host<uint16_t>(static_cast<size_t>(total) * H);
  const std::vector<int32_t> ids_ref = di.to_host<int32_t>(static_cast<size_t>(total) * k);

  // the ranks: contiguous slices, each with the shared expert (fused slots and unfused MLP)
  const ep::Placement p = ep::Placement::contiguous(spec.num_experts, W);
  std::vector<std::unique_ptr<DeviceStacks>> stacks;
  std::vector<std::unique_ptr<Dev>> ys;
  std::vector<ep::LocalRank> ranks;
  int first = 0;
  for (int r = 0; r < W; ++r) {
    StackOptions so;
    so.expert_offset = p.contiguous_first(r);
    so.expert_count = p.local_experts(r);
    stacks.push_back(std::make_unique<DeviceStacks>(make_stacks(*lw, so)));
    const size_t n = static_cast<size_t>(c.split[r]) * H * sizeof(Bf16);
    ys.push_back(std::make_unique<Dev>(n));
    cudaMemset(ys.back()->p, 0xff, n > 0 ? n : 16);
    ranks.push_back({stacks.back()->view, static_cast<const char*>(dx.p) + first * H * sizeof(Bf16),
                     ys.back()->p, c.split[r]});
    first += c.split[r];
  }
  ep::LocalOptions lo;
  lo.mode = mode;
  lo.max_tokens_per_rank = most;
  lo.engine = engine_options(most, FuseShared::Auto);
  ep::LocalTransportLayer layer(spec, p, lo);
  layer.forward(ranks, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(layer.read_status(nullptr).ok());

  // ids: each rank routes its own batch, whose router GEMM may sum in another order than the
  // whole batch's, so a token tied to an ulp may pick another expert (at most 1 in 100 tokens,
  // layer_test_util.h's rule); y is compared on the tokens whose ids agree
  first = 0;
  double err = 0, norm = 0;
  size_t non_finite = 0;
  int differing = 0;
  for (int r = 0; r < W; ++r) {
    const int T = c.split[r];
    const std::vector<int32_t> ids = layer.topk_ids(r, nullptr);
    ASSERT_EQ(ids.size(), static_cast<size_t>(T) * k);
    std::vector<bool> same(T, true);
    for (int t = 0; t < T; ++t) {
      for (int j = 0; j < k; ++j) {
        same[t] = same[t] && ids[t * k + j] == ids_ref[static_cast<size_t>(first + t) * k + j];
      }
      differing += same[t] ? 0 : 1;
    }
    // the rows sent are the CPU plan's for the same routing (each token once per destination)
    Routing rt;
    rt.tokens = T;
    rt.slots = k;
    rt.ids = ids;
    rt.weights.assign(ids.size(), 1.0f);
    const ep::DispatchPlan plan = ep::plan_dispatch(p, r, rt, 0);
    const std::vector<int32_t> sent = layer.rows_sent(r, nullptr);
    for (int d = 0; d < W; ++d) {
      EXPECT_EQ(sent[d], d == r ? 0 : plan.rows_to(d)) << "rank " << r << " to " << d;
    }
    const std::vector<uint16_t> y = ys[r]->to_host<uint16_t>(static_cast<size_t>(T) * H);
    for (size_t i = 0; i < y.size(); ++i) {
      const double a = bf16_to_float(Bf16{y[i]});
      non_finite += std::isfinite(a) ? 0 : 1;
      if (!same[i / H]) continue;
      const double b = bf16_to_float(Bf16{y_ref[static_cast<size_t>(first) * H + i]});
      err += (a - b) * (a - b);
      norm += b * b;
    }
    first += T;
  }
  EXPECT_LE(differing, total / 100) << "tokens routed differently";
  EXPECT_EQ(non_finite, 0u);
  if (total > 0) {
    EXPECT_LE(std::sqrt(err / std::max(norm, 1e-30)), 1e-2) << "relative error by norm";
  }
}

class EpLocal : public ::testing::TestWithParam<std::string> {};

TEST_P(EpLocal, TwoAndFourRanksMatchTheSingleGpuLayer) {
  SKIP_WITHOUT_GPU();
  const std::vector<EpCase> cases = {
      {2, {1, 1}}, {2, {3, 5}}, {2, {0, 4}}, {2, {40, 33}}, {2, {200, 150}}, {4, {2, 0, 7, 1}},
  };
  for (const EpCase& c : cases) {
    for (ep::Mode mode : {ep::Mode::Throughput, ep::Mode::LowLatency}) {
      run_case(GetParam(), c, mode);
      if (HasFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EpLocal, ::testing::ValuesIn(kEpModels), [](const auto& info) {
  std::string n = info.param;
  for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return n;
});

TEST(EpLocalErrors, MismatchedViewsAndTooManyTokens) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = small_spec("qwen3-30b-a3b");
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 3);
  const ep::Placement p = ep::Placement::contiguous(spec.num_experts, 2);
  ep::LocalOptions lo;
  lo.max_tokens_per_rank = 4;
  ep::LocalTransportLayer layer(spec, p, lo);
  StackOptions so;
  so.expert_offset = 0;
  so.expert_count = 16;
  const DeviceStacks r0(make_stacks(*lw, so));
  Dev dx(8 * spec.hidden * sizeof(Bf16)), dy(8 * spec.hidden * sizeof(Bf16));
  expect_error(
      [&] {
        layer.forward({{r0.view, dx.p, dy.p, 1}, {r0.view, dx.p, dy.p, 1}}, nullptr);
      },
      {"rank 1's view holds experts [0, 16)"});
  so.expert_offset = 16;
  const DeviceStacks r1(make_stacks(*lw, so));
  expect_error(
      [&] {
        layer.forward({{r0.view, dx.p, dy.p, 5}, {r1.view, dx.p, dy.p, 1}}, nullptr);
      },
      {"rank 0 routes 5 tokens", "max_tokens_per_rank 4"});
  std::vector<int> swapped(32);
  for (int e = 0; e < 32; ++e) swapped[e] = e ^ 1;  // every expert on one rank, rows out of order
  expect_error([&] { ep::LocalTransportLayer(spec, ep::Placement::from_map(32, {swapped}), lo); },
               {"contiguous placements"});
}

}  // namespace
}  // namespace moekit::test
