// The engine API (include/moekit/moe.h) on host views: borrowed weights in the engine's layout
// give what the CPU backends give on moekit's own weights, bit for bit where the math is the same
// (forward, route, experts on the reference's routing), expert slices sum to the whole layer,
// and bad views or ids are errors that name the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "expect_error.h"
#include "moekit/cpu_fast.h"
#include "moekit/layer.h"
#include "moekit/moe.h"
#include "shrunk_spec.h"

namespace moekit::test {
namespace {

// families that cover every routing mode, the gated shared expert (8 slots), expert biases,
// the fp32 router and the swigluoai activation
const std::vector<std::string> kEngineModels = {
    "deepseek-v3",  "qwen2-57b-a14b", "gpt-oss-120b",    "minimax-m3",
    "mixtral-8x7b", "qwen3-30b-a3b",  "deepseek-v2-lite"};

MoeSpec engine_spec(const std::string& model) { return shrunk_spec(model, 64, 32, 16); }

class EngineApi : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineApi, ForwardMatchesTheBackendsBitForBit) {
  const MoeSpec spec = engine_spec(GetParam());
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 7);
  const EngineStacks st = make_stacks(*lw);
  for (int tokens : {1, 5, 33}) {
    const std::vector<Bf16> x = random_input(tokens, spec.hidden, 11 + tokens, 1.0f);
    for (FuseShared fuse : {FuseShared::On, FuseShared::Off}) {
      if (fuse == FuseShared::On && !spec.can_fuse_shared()) continue;
      MoeOptions opt;
      opt.fuse = fuse;
      opt.max_tokens = 64;
      std::vector<Bf16> y(x.size());
      for (CpuBackend be : {CpuBackend::Reference, CpuBackend::Fast}) {
        opt.cpu_backend = be;
        MoeOp op(spec, opt);
        op.forward(st.view, x.data(), y.data(), tokens, nullptr, 0, nullptr);
        const ForwardResult ref = be == CpuBackend::Reference
                                      ? cpu_reference::forward(*lw, x.data(), tokens, fuse)
                                      : cpu_fast::forward(*lw, x.data(), tokens, fuse);
        expect_same_bits(y, to_bf16(ref.y),
                         GetParam() + " T=" + std::to_string(tokens) + " fuse " +
                             fuse_shared_name(fuse) +
                             (be == CpuBackend::Reference ? " reference" : " fast"));
      }
    }
  }
}

TEST_P(EngineApi, RouteAndExpertsMatchTheReference) {
  const MoeSpec spec = engine_spec(GetParam());
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 3);
  const EngineStacks st = make_stacks(*lw);
  const int tokens = 9, k = spec.top_k;
  const std::vector<Bf16> x = random_input(tokens, spec.hidden, 5, 1.0f);
  for (FuseShared fuse : {FuseShared::On, FuseShared::Off}) {
    if (fuse == FuseShared::On && !spec.can_fuse_shared()) continue;
    const ForwardResult ref = cpu_reference::forward(*lw, x.data(), tokens, fuse);
    MoeOptions opt;
    opt.fuse = fuse;
    opt.cpu_backend = CpuBackend::Reference;
    MoeOp op(spec, opt);
    std::vector<int32_t> ids(static_cast<size_t>(tokens) * k);
    std::vector<float> w(ids.size()), scale(tokens, -1.0f);
    op.route(st.view, x.data(), tokens, ids.data(), w.data(), scale.data(), nullptr, 0, nullptr);
    for (int t = 0; t < tokens; ++t) {
      for (int j = 0; j < k; ++j) {
        const size_t r = static_cast<size_t>(t) * ref.routing.slots + j;
        EXPECT_EQ(ids[t * k + j], ref.routing.ids[r]) << "token " << t << " slot " << j;
        EXPECT_EQ(w[t * k + j], ref.routing.weights[r]) << "token " << t << " slot " << j;
      }
      if (!ref.routing.shared_scale.empty()) EXPECT_EQ(scale[t], ref.routing.shared_scale[t]);
    }
    // the logits entry routes the same
    const std::vector<float> logits = cpu_reference::router_logits(*lw, x.data(), tokens);
    std::vector<int32_t> ids2(ids.size());
    std::vector<float> w2(ids.size());
    op.route_logits(st.view, logits.data(), tokens, ids2.data(), w2.data(), nullptr, nullptr, 0,
                    nullptr);
    EXPECT_EQ(ids2, ids);
    EXPECT_EQ(w2, w);
    // experts on the reference's routing: the reference forward's y, bit for bit
    ExpertsOptions eo;
    eo.shared_scale = spec.shared_kind == SharedKind::Gated ? scale.data() : nullptr;
    for (CpuBackend be : {CpuBackend::Reference, CpuBackend::Fast}) {
      opt.cpu_backend = be;
      MoeOp eop(spec, opt);
      std::vector<Bf16> y(x.size());
      eop.experts(st.view, x.data(), ids.data(), w.data(), y.data(), tokens, eo, nullptr, 0,
                  nullptr);
      const bool add_shared = !ref.fused && spec.shared_kind != SharedKind::None;
      const std::vector<float> want =
          be == CpuBackend::Reference
              ? ref.y
              : cpu_fast::experts(*lw, x.data(), tokens, ref.routing, add_shared);
      expect_same_bits(y, to_bf16(want), GetParam() + " experts, fuse " + fuse_shared_name(fuse));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EngineApi, ::testing::ValuesIn(kEngineModels),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-' || c == '.') c = '_';
                           return n;
                         });

TEST(EngineApiView, PaddedStridesReadOnlyTheExperts) {
  const MoeSpec spec = engine_spec("deepseek-v3");
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 1);
  StackOptions so;
  so.pad = 40;  // NaN between the experts: reading past an expert shows in y
  const EngineStacks padded = make_stacks(*lw, so);
  const EngineStacks dense = make_stacks(*lw);
  const int tokens = 6;
  const std::vector<Bf16> x = random_input(tokens, spec.hidden, 2, 1.0f);
  MoeOp op(spec, MoeOptions{});
  std::vector<Bf16> a(x.size()), b(x.size());
  op.forward(padded.view, x.data(), a.data(), tokens, nullptr, 0, nullptr);
  op.forward(dense.view, x.data(), b.data(), tokens, nullptr, 0, nullptr);
  expect_same_bits(a, b, "padded vs dense stacks");
}

TEST(EngineApiView, ExpertSlicesSumToTheWholeLayer) {
  const MoeSpec spec = engine_spec("deepseek-v3");  // 16 experts, one shared slot
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 4);
  const int tokens = 12;
  const std::vector<Bf16> x = random_input(tokens, spec.hidden, 8, 1.0f);
  const ForwardResult whole = cpu_reference::forward(*lw, x.data(), tokens, FuseShared::On);
  for (CpuBackend be : {CpuBackend::Reference, CpuBackend::Fast}) {
    MoeOptions opt;
    opt.cpu_backend = be;
    MoeOp op(spec, opt);
    std::vector<double> sum(x.size(), 0.0);
    // rank 0 holds experts [0, 5) and the shared expert; ranks 1, 2 the rest without it
    const int bounds[] = {0, 5, 11, 16};
    for (int rank = 0; rank < 3; ++rank) {
      StackOptions so;
      so.expert_offset = bounds[rank];
      so.expert_count = bounds[rank + 1] - bounds[rank];
      so.fused_slots = rank == 0;
      so.unfused_shared = false;
      const EngineStacks st = make_stacks(*lw, so);
      std::vector<Bf16> y(x.size());
      op.forward(st.view, x.data(), y.data(), tokens, nullptr, 0, nullptr);
      for (size_t i = 0; i < y.size(); ++i) sum[i] += bf16_to_float(y[i]);
    }
    double err = 0, norm = 0;
    for (size_t i = 0; i < sum.size(); ++i) {
      err += (sum[i] - whole.y[i]) * (sum[i] - whole.y[i]);
      norm += static_cast<double>(whole.y[i]) * whole.y[i];
    }
    // three bf16 roundings of partial sums against one
    EXPECT_LT(std::sqrt(err / norm), 1e-2) << (be == CpuBackend::Reference ? "reference" : "fast");
    EXPECT_GT(norm, 0.0);
  }
}

TEST(EngineApiView, ViewOnlyWithFusedSlotsRunsFused) {
  const MoeSpec spec = engine_spec("qwen2-57b-a14b");  // gated shared expert, 8 slots
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 6);
  StackOptions so;
  so.unfused_shared = false;
  const EngineStacks st = make_stacks(*lw, so);
  const int tokens = 4;
  const std::vector<Bf16> x = random_input(tokens, spec.hidden, 9, 1.0f);
  MoeOptions opt;
  opt.cpu_backend = CpuBackend::Reference;
  MoeOp op(spec, opt);  // fuse auto: the fused slots, the only form held
  std::vector<Bf16> y(x.size());
  op.forward(st.view, x.data(), y.data(), tokens, nullptr, 0, nullptr);
  expect_same_bits(y, to_bf16(cpu_reference::forward(*lw, x.data(), tokens, FuseShared::On).y),
                   "fused slots only");
  opt.fuse = FuseShared::Off;
  MoeOp off(spec, opt);
  expect_error([&] { off.forward(st.view, x.data(), y.data(), tokens, nullptr, 0, nullptr); },
               {"fuse off needs the unfused shared MLP", "only the fused slots"});
}

TEST(EngineApiView, TheSharedExpertLeftOutOnRequest) {
  const MoeSpec spec = engine_spec("qwen2-57b-a14b");  // gated shared expert
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 10);
  const EngineStacks st = make_stacks(*lw);
  const int tokens = 5, k = spec.top_k;
  const std::vector<Bf16> x = random_input(tokens, spec.hidden, 4, 1.0f);
  MoeOptions opt;
  opt.cpu_backend = CpuBackend::Reference;
  MoeOp op(spec, opt);
  std::vector<int32_t> ids(tokens * k);
  std::vector<float> w(ids.size());
  op.route(st.view, x.data(), tokens, ids.data(), w.data(), nullptr, nullptr, 0, nullptr);
  ExpertsOptions eo;
  eo.add_shared = false;
  std::vector<Bf16> y(x.size());
  op.experts(st.view, x.data(), ids.data(), w.data(), y.data(), tokens, eo, nullptr, 0, nullptr);
  const std::vector<float> logits = cpu_reference::router_logits(*lw, x.data(), tokens);
  const Routing r = cpu_reference::route(RoutingConfig::from_spec(spec, false), logits.data(),
                                         tokens, lw->correction_bias());
  expect_same_bits(y, to_bf16(cpu_reference::experts(*lw, x.data(), tokens, r, false)),
                   "routed experts only");
  // a view holding no form of the shared expert leaves it out of forward too
  StackOptions so;
  so.fused_slots = false;
  so.unfused_shared = false;
  const EngineStacks bare = make_stacks(*lw, so);
  std::vector<Bf16> y2(x.size());
  op.forward(bare.view, x.data(), y2.data(), tokens, nullptr, 0, nullptr);
  expect_same_bits(y2, y, "a view without the shared expert");
}

TEST(EngineApiView, BadViewsNameTheProblem) {
  const MoeSpec spec = engine_spec("gpt-oss-120b");  // router bias, expert biases
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 2);
  const EngineStacks st = make_stacks(*lw);
  auto bad = [&](auto edit, std::vector<std::string> frags) {
    MoeWeightsView v = st.view;
    edit(v);
    expect_error([&] { validate_view(spec, v); }, frags);
  };
  bad([](MoeWeightsView& v) { v.router_weight = nullptr; }, {"router_weight", "is null"});
  bad([](MoeWeightsView& v) { v.router_bias = nullptr; }, {"router bias", "router_bias is null"});
  bad([](MoeWeightsView& v) { v.w13 = nullptr; }, {"w13", "is null"});
  bad([](MoeWeightsView& v) { v.b2 = nullptr; }, {"expert biases", "b2 is null"});
  bad(
      [&](MoeWeightsView& v) {
        v.w13_expert_stride = 2LL * spec.expert_intermediate * spec.hidden - 1;
      },
      {"w13_expert_stride", "smaller than one expert's [2I, H]"});
  bad([](MoeWeightsView& v) { v.w2_expert_stride = 8; }, {"w2_expert_stride = 8", "[H, I]"});
  bad([](MoeWeightsView& v) { v.expert_offset = 10, v.expert_count = 7; },
      {"expert slice [10, 17)", "outside the 16 experts"});
  bad([](MoeWeightsView& v) { v.expert_offset = -1; }, {"expert_offset", "got -1"});
  bad([](MoeWeightsView& v) { v.fused_slots = 1; }, {"fused_slots 0 or 0", "got 1"});

  const MoeSpec ds = engine_spec("deepseek-v3");
  const auto dlw = make_random_weights(ds, ds.moe_layers.front(), 2);
  const EngineStacks dst = make_stacks(*dlw);
  MoeWeightsView v = dst.view;
  v.correction_bias = nullptr;
  expect_error([&] { validate_view(ds, v); },
               {"e_score_correction_bias", "correction_bias is null"});
  v = dst.view;
  v.shared_w2 = nullptr;
  expect_error([&] { validate_view(ds, v); }, {"shared_w13 and shared_w2", "only shared_w13"});
}

// Each call validates what it reads: experts() takes no router and no routing biases,
// route_logits no router and no stacks; forward still asks for everything.
TEST(EngineApiView, EachCallValidatesOnlyWhatItReads) {
  for (const std::string model : {"gpt-oss-120b", "deepseek-v3"}) {
    const MoeSpec spec = engine_spec(model);
    const auto lw = make_random_weights(spec, spec.moe_layers.front(), 5);
    const EngineStacks st = make_stacks(*lw);
    const int tokens = 4, k = spec.top_k;
    const std::vector<Bf16> x = random_input(tokens, spec.hidden, 3, 1.0f);
    MoeOptions opt;
    opt.cpu_backend = CpuBackend::Reference;
    MoeOp op(spec, opt);
    std::vector<int32_t> ids(static_cast<size_t>(tokens) * k);
    std::vector<float> w(ids.size());
    op.route(st.view, x.data(), tokens, ids.data(), w.data(), nullptr, nullptr, 0, nullptr);
    std::vector<Bf16> want(x.size()), got(x.size());
    op.experts(st.view, x.data(), ids.data(), w.data(), want.data(), tokens, {}, nullptr, 0,
               nullptr);

    MoeWeightsView stacks_only = st.view;
    stacks_only.router_weight = nullptr;
    stacks_only.router_bias = nullptr;
    stacks_only.correction_bias = nullptr;
    validate_view(spec, stacks_only, ViewUse::Experts);
    op.experts(stacks_only, x.data(), ids.data(), w.data(), got.data(), tokens, {}, nullptr, 0,
               nullptr);
    expect_same_bits(got, want, model + " experts() on a view without a router");
    expect_error([&] { validate_view(spec, stacks_only); }, {"router_weight", "is null"});
    expect_error(
        [&] { op.forward(stacks_only, x.data(), got.data(), tokens, nullptr, 0, nullptr); },
        {"router_weight", "forward reads the router"});
    expect_error(
        [&] {
          op.route(stacks_only, x.data(), tokens, ids.data(), w.data(), nullptr, nullptr, 0,
                   nullptr);
        },
        {"router_weight", "route reads the router"});

    // route_logits: the correction bias alone (where the spec has one), no router, no stacks
    MoeWeightsView bias_only;
    bias_only.correction_bias = st.view.correction_bias;
    bias_only.w13_expert_stride = 7;  // a stack's field it does not read
    const std::vector<float> logits = cpu_reference::router_logits(*lw, x.data(), tokens);
    std::vector<int32_t> ids2(ids.size());
    std::vector<float> w2(ids.size());
    op.route_logits(bias_only, logits.data(), tokens, ids2.data(), w2.data(), nullptr, nullptr, 0,
                    nullptr);
    EXPECT_EQ(ids2, ids) << model;
    EXPECT_EQ(w2, w) << model;
    if (spec.has_correction_bias) {
      bias_only.correction_bias = nullptr;
      expect_error(
          [&] {
            op.route_logits(bias_only, logits.data(), tokens, ids2.data(), w2.data(), nullptr,
                            nullptr, 0, nullptr);
          },
          {"e_score_correction_bias", "correction_bias is null"});
    }
    // experts() still checks the stacks
    stacks_only.w2 = nullptr;
    expect_error(
        [&] {
          op.experts(stacks_only, x.data(), ids.data(), w.data(), got.data(), tokens, {}, nullptr,
                     0, nullptr);
        },
        {"w2 of", "is null"});
  }
}

TEST(EngineApiView, ExpertsRejectIdsOutOfRangeAndTooManyTokens) {
  const MoeSpec spec = engine_spec("qwen3-30b-a3b");
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 2);
  const EngineStacks st = make_stacks(*lw);
  const int tokens = 2, k = spec.top_k;
  const std::vector<Bf16> x = random_input(tokens, spec.hidden, 1, 1.0f);
  std::vector<int32_t> ids(tokens * k);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % spec.num_experts);
  ids[k + 3] = spec.num_experts;  // one past the last expert
  std::vector<float> w(ids.size(), 0.1f);
  std::vector<Bf16> y(x.size());
  MoeOptions opt;
  opt.max_tokens = 2;
  MoeOp op(spec, opt);
  EXPECT_TRUE(op.read_host_status().ok());
  expect_error(
      [&] {
        op.experts(st.view, x.data(), ids.data(), w.data(), y.data(), tokens, {}, nullptr, 0,
                   nullptr);
      },
      {"topk_ids[1, 3] = 16", "outside [0, 16)"});
  // the host call reports the device's status bit too, until it is read and cleared
  EXPECT_EQ(op.read_host_status(false).word(), kStatusExpertIdOutOfRange);
  const MoeStatus s = op.read_host_status();
  EXPECT_TRUE(s.expert_id_out_of_range);
  EXPECT_NE(s.message().find("outside [0, E)"), std::string::npos) << s.message();
  EXPECT_TRUE(op.read_host_status().ok()) << "cleared by the read";
  EXPECT_EQ(MoeStatus::from_word(kStatusExpertIdOutOfRange).word(), kStatusExpertIdOutOfRange);
  expect_error([&] { op.forward(st.view, x.data(), y.data(), 3, nullptr, 0, nullptr); },
               {"max_tokens (2)", "got 3"});
  // a slice holding other experts: ViewLayerWeights names what it holds
  StackOptions so;
  so.expert_offset = 4;
  so.expert_count = 4;
  const EngineStacks part = make_stacks(*lw, so);
  const ViewLayerWeights pw(spec, part.view);
  expect_error([&] { pw.expert(2); }, {"expert 2", "holds experts [4, 8)"});
}

#ifndef MOEKIT_WITH_CUDA
TEST(EngineApiView, DeviceViewsNeedCuda) {
  const MoeSpec spec = engine_spec("mixtral-8x7b");
  const auto lw = make_random_weights(spec, spec.moe_layers.front(), 2);
  EngineStacks st = make_stacks(*lw);
  st.view.location = Location::Device;
  MoeOp op(spec, MoeOptions{});
  EXPECT_EQ(workspace_bytes(spec, 16, MoeOptions{}), 0u);
  std::vector<Bf16> x(spec.hidden), y(spec.hidden);
  expect_error([&] { op.forward(st.view, x.data(), y.data(), 1, nullptr, 0, nullptr); },
               {"forward on a device view", "built without CUDA"});
  expect_error([&] { op.prepare_workspace(nullptr, 0, nullptr); }, {"built without CUDA"});
  expect_error([&] { (void)op.read_status(nullptr, nullptr); }, {"built without CUDA"});
}
#endif

}  // namespace
}  // namespace moekit::test
