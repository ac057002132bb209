// The GPU layer's knobs at small shapes (scripts/gpu_check.sh runs the tests named *Small* under
// memcheck, racecheck, initcheck and synccheck): each test asserts the plans a knob produces
// (kernel instances by name, on the "sm90" profile, without a GPU), then on the GPU that the
// knob's output matches the CPU reference and equals the default's bit for bit
// (knob_test_util.h). The rings' knobs: test_layer_small_rings.cpp.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "knob_test_util.h"
#include "layer_test_util.h"
#include "moekit/cuda_layer.h"
#include "moekit/plan.h"

namespace moekit {
namespace {

using namespace moekit::test;
using O = plan::PlanOverrides;

// Both fusion modes and every kernel family at shapes the sanitizers take, and the dispatch on
// its own. The plan runs the forced family's instances in every launch.
TEST(GpuLayerSmall, SanitizerShapesEveryFamily) {
  const cuda::GpuLayerOptions opt = base_options(20);
  const plan::Stream families[] = {plan::Stream::Registers, plan::Stream::RegistersEarlyActs,
                                   plan::Stream::Bulk};
  for (const std::string model : {"deepseek-v3", "qwen2-57b-a14b", "gpt-oss-120b"}) {
    const MoeSpec spec = small_spec(model, 128, 16, 64);
    for (plan::Stream s : families) {
      O o = opt.overrides;
      o.stream = s;
      for (int tokens : {2, 7, 20}) {
        for (const plan::ExpertLaunch& l : sm90_plan(spec, tokens, FuseShared::Auto, o).experts) {
          EXPECT_EQ(plan::expert_kernels()[l.kernel].stream, s)
              << model << " T=" << tokens << " " << l.role << ": "
              << plan::expert_kernels()[l.kernel].name << " is not " << plan::stream_name(s);
        }
      }
    }
  }
  SKIP_WITHOUT_GPU();
  for (const std::string model : {"deepseek-v3", "qwen2-57b-a14b", "gpt-oss-120b"}) {
    const MoeSpec spec = small_spec(model, 128, 16, 64);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 2);
    for (plan::Stream s : families) {
      O o = opt.overrides;
      o.stream = s;
      const auto gpu = create_with(*w, opt, o);
      for (int tokens : {2, 7, 20}) {
        const std::vector<Bf16> x = random_x(tokens, spec.hidden, tokens);
        for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
          std::ostringstream what;
          what << spec.name << " T=" << tokens << " fuse=" << fuse_shared_name(fuse)
               << " stream=" << plan::stream_name(s);
          expect_layer_runs_its_plan(*gpu, spec, tokens, fuse, o, what.str());
          const ForwardResult g = gpu->forward(x.data(), tokens, fuse);
          expect_layer_matches_cpu(spec, *w, x.data(), tokens, g, fuse, what.str());
        }
      }
    }
    const RoutingConfig cfg = RoutingConfig::from_spec(spec, spec.can_fuse_shared());
    std::vector<float> logits(static_cast<size_t>(9) * cfg.logits_columns);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 37) % 23) * 0.1f;
    std::vector<float> bias(spec.num_experts, 0.25f);
    cuda::GpuDispatch d;
    const Routing g = cuda::route_on_device(cfg, logits.data(), 9, bias.data(), 8, &d);
    EXPECT_EQ(g.ids, cpu_reference::route(cfg, logits.data(), 9, bias.data()).ids) << model;
    EXPECT_FALSE(d.id_out_of_range) << model;
  }
}

// The bulk gate/up kernel's dynamic tail at its extremes and between: no claims (static ranges
// only), some, and every item claimed. Against the CPU reference, and a forward repeated bit for
// bit (the claims land differently each time, the results do not).
TEST(GpuLayerSmall, BulkDynamicTailAtEveryShare) {
  const cuda::GpuLayerOptions opt = base_options(20);
  for (int tail : {0, 30, 100}) {
    const O o = with(bulk(opt.overrides), &O::gate_up_tail_percent, tail);
    const plan::LayerPlan p = sm90_plan(small_spec("deepseek-v3", 128, 16, 64), 7,
                                        FuseShared::Auto, o);
    for (const plan::ExpertLaunch& l : p.experts) {
      if (plan::expert_kernels()[l.kernel].gemm == plan::Gemm::GateUp) {
        EXPECT_EQ(l.dynamic_tail_percent, tail) << plan::describe(p);
      }
    }
  }
  SKIP_WITHOUT_GPU();
  for (const std::string model : {"deepseek-v3", "qwen3-30b-a3b"}) {
    const MoeSpec spec = small_spec(model, 128, 16, 64);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 12);
    for (int tail : {0, 30, 100}) {
      const auto gpu = create_with(*w, opt, with(bulk(opt.overrides), &O::gate_up_tail_percent, tail));
      for (int tokens : {1, 7, 20}) {
        const std::vector<Bf16> x = random_x(tokens, spec.hidden, 40 + tokens);
        for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
          std::ostringstream what;
          what << spec.name << " T=" << tokens << " fuse=" << fuse_shared_name(fuse)
               << " tail=" << tail << "%";
          const ForwardResult g = gpu->forward(x.data(), tokens, fuse);
          expect_layer_matches_cpu(spec, *w, x.data(), tokens, g, fuse, what.str());
          EXPECT_EQ(gpu->forward(x.data(), tokens, fuse).y, g.y) << what.str();
        }
      }
    }
  }
}

// The bulk down kernel's items of one partial k chunk, one full chunk (32 blocks of 64), and a
// full chunk and one block (two stages per item), so that the sanitizer runs (small shapes only)
// cover the multi-stage down items of the real shapes. 2048: the one-token, split-row and
// 16-token instances; 2112 (rows of two chunks): the standard ring's.
TEST(GpuLayerSmall, BulkDownItemsOfOneAndTwoStages) {
  const cuda::GpuLayerOptions opt = base_options(20);
  const O o = bulk(opt.overrides);
  const MoeSpec s2048 = small_spec("deepseek-v3", 128, 16, 2048);
  EXPECT_TRUE(plan_runs(s2048, 1, FuseShared::Auto, o, "bulk_down_one_token"));
  EXPECT_TRUE(plan_runs(s2048, 7, FuseShared::Auto, o, "bulk_down_split_rows"));
  EXPECT_TRUE(plan_runs(s2048, 20, FuseShared::Auto, o, "bulk_down_16_weights_only"));
  EXPECT_TRUE(plan_runs(small_spec("deepseek-v3", 128, 16, 2112), 7, FuseShared::Auto, o,
                        "bulk_down"));
  SKIP_WITHOUT_GPU();
  for (int inter : {64, 2048, 2112}) {
    const MoeSpec spec = small_spec("deepseek-v3", 128, 16, inter);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 15);
    const auto gpu = create_with(*w, opt, o);
    for (int tokens : {1, 7, 20}) {
      const std::vector<Bf16> x = random_x(tokens, spec.hidden, 70 + tokens);
      for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
        std::ostringstream what;
        what << spec.name << " I=" << inter << " T=" << tokens << " fuse=" << fuse_shared_name(fuse);
        const ForwardResult g = gpu->forward(x.data(), tokens, fuse);
        expect_layer_matches_cpu(spec, *w, x.data(), tokens, g, fuse, what.str());
      }
    }
  }
}

// The fused shared experts' gate/up items issued before the kernel waits for the dispatch, and
// not: one and two shared experts (DeepSeek-V2-Lite, Qwen2-57B's gated shared MLP as two slots),
// tasks of 8 and of 16 tokens (T=300). Bit for bit equal (the same items, another order).
TEST(GpuLayerSmall, BulkSharedExpertsFirstOrAfterTheWait) {
  const cuda::GpuLayerOptions opt = base_options(300);
  const O off = with(bulk(opt.overrides), &O::shared_first_tokens, 0);
  const O on = with(bulk(opt.overrides), &O::shared_first_tokens, 300);
  const char* const models[] = {"deepseek-v3", "deepseek-v2-lite", "qwen2-57b-a14b"};
  for (const char* model : models) {
    const MoeSpec spec = small_spec(model, 128, 16, 64);
    ASSERT_GT(spec.shared_slots(), 0) << model;
    for (int t : {1, 7, 20, 300}) {
      // the gate/up launch (the last but one) issues the fused shared slots first, or none
      const plan::LayerPlan p_on = sm90_plan(spec, t, FuseShared::On, on);
      const plan::LayerPlan p_off = sm90_plan(spec, t, FuseShared::On, off);
      EXPECT_EQ(p_on.experts.end()[-2].early_shared, spec.shared_slots()) << plan::describe(p_on);
      EXPECT_EQ(p_off.experts.end()[-2].early_shared, 0) << plan::describe(p_off);
    }
  }
  EXPECT_EQ(sm90_plan(small_spec("deepseek-v3", 128, 16, 64), 300, FuseShared::On, on).chunk, 16);
  SKIP_WITHOUT_GPU();
  for (const char* model : models) {
    const MoeSpec spec = small_spec(model, 128, 16, 64);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 13);
    expect_knob_keeps_the_output(spec, *w, opt, off, on, "shared_first_tokens=300",
                                 {1, 7, 20, 300}, FuseShared::On, 50);
  }
}

// The bulk down kernel's 4 KB weight rows copied in two pieces (down_split_tokens; inter 2048 is
// DeepSeek-V3's: one 4 KB chunk per row) against one copy per row. The ring of weights only and
// the one-token ring take the split copies' place by default (at 2 and at 1 token), so both are
// off here: the split instance runs at 1, 2 and 7 tokens.
TEST(GpuLayerSmall, BulkDownWeightRowsInTwoCopies) {
  const cuda::GpuLayerOptions opt = base_options(8);
  const O base = with(with(bulk(opt.overrides), &O::weights_only_tokens, 0), &O::one_token_rings, 0);
  const O off = with(base, &O::down_split_tokens, 0);
  const O on = with(base, &O::down_split_tokens, 8);
  const MoeSpec spec = small_spec("deepseek-v3", 128, 16, 2048);
  for (int t : {1, 2, 7}) {
    EXPECT_TRUE(plan_runs(spec, t, FuseShared::Auto, on, "bulk_down_split_rows")) << "T=" << t;
    EXPECT_FALSE(plan_runs(spec, t, FuseShared::Auto, off, "bulk_down_split_rows")) << "T=" << t;
    EXPECT_TRUE(plan_runs(spec, t, FuseShared::Auto, off, "bulk_down")) << "T=" << t;
  }
  // by default another ring runs at 1 and 2 tokens, so only these settings reach the instance
  EXPECT_FALSE(plan_runs(spec, 2, FuseShared::Auto, bulk(opt.overrides), "bulk_down_split_rows"));
  SKIP_WITHOUT_GPU();
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 17);
  expect_knob_keeps_the_output(spec, *w, opt, off, on, "down_split_tokens=8", {1, 2, 7},
                               FuseShared::Auto, 60);
}

// The split-row down instance with a dynamic tail (down_tail_percent forced at <= 8 tokens, the
// ring of weights only and the one-token rings off, as above): bit for bit equal to static
// ranges, fused and unfused, at 1, 2 and 7 tokens.
TEST(GpuLayerSmall, BulkDownWeightRowsInTwoCopiesWithDynamicTail) {
  const cuda::GpuLayerOptions opt = base_options(8);
  const O base = with(with(bulk(opt.overrides), &O::weights_only_tokens, 0), &O::one_token_rings, 0);
  const O off = with(base, &O::down_tail_percent, 0);
  const MoeSpec spec = small_spec("deepseek-v3", 128, 16, 2048);
  for (int t : {1, 2, 7}) {
    EXPECT_TRUE(plan_runs(spec, t, FuseShared::Auto, off, "bulk_down_split_rows")) << "T=" << t;
    for (int tail : {50, 100}) {
      EXPECT_TRUE(plan_runs(spec, t, FuseShared::Auto, with(base, &O::down_tail_percent, tail),
                            "bulk_down_split_rows_tail"))
          << "T=" << t;
    }
  }
  SKIP_WITHOUT_GPU();
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 19);
  for (int tail : {50, 100}) {
    expect_knob_keeps_the_output_both(spec, *w, opt, off, with(base, &O::down_tail_percent, tail),
                                      "down_tail_percent=" + std::to_string(tail), {1, 2, 7}, 65);
  }
}

// The bulk down kernel's deep ring (4 stages of 2 KB chunks; rows of <= 2 KB: inter 768, as
// Qwen3-30B-A3B) against the 2-stage ring (a warp takes the same k blocks in the same order).
// Forced at 40 tokens too (two tasks of one expert), with tasks of 16 off (they take the deep
// ring's place there); at one token the narrow one-token ring is the deep ring's.
TEST(GpuLayerSmall, BulkDownDeepRing) {
  const cuda::GpuLayerOptions opt = base_options(40);
  const O base = with(bulk(opt.overrides), &O::task16_from, 0);
  const O off = with(base, &O::down_deep_tokens, 0);
  const O on = with(base, &O::down_deep_tokens, 64);
  const MoeSpec spec = small_spec("qwen3-30b-a3b", 256, 16, 768);
  EXPECT_TRUE(plan_runs(spec, 1, FuseShared::Auto, on, "bulk_down_one_token_narrow"));
  for (int t : {7, 40}) EXPECT_TRUE(plan_runs(spec, t, FuseShared::Auto, on, "bulk_down_deep"));
  for (int t : {1, 7, 40}) {
    EXPECT_TRUE(plan_runs(spec, t, FuseShared::Auto, off, "bulk_down")) << "T=" << t;
  }
  SKIP_WITHOUT_GPU();
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 23);
  expect_knob_keeps_the_output(spec, *w, opt, off, on, "down_deep_tokens=64", {1, 7, 40},
                               FuseShared::Auto, 70);
}

// The bulk gate/up kernel's half items (the dynamic tail's last items claimed as two halves of
// 4 h rows each) against whole items: 2 per CTA and 16 per CTA (every tail item halved); fused
// and unfused (the shared MLP's gate/up launch halves its tail too); tasks of 16 off at 40 tokens
// (their ring of weights only has no half items).
TEST(GpuLayerSmall, BulkGateUpHalfTailItems) {
  const cuda::GpuLayerOptions opt = base_options(40);
  const O base = with(bulk(opt.overrides), &O::task16_from, 0);
  const O off = with(base, &O::half_items_per_cta, 0);
  const MoeSpec spec = small_spec("deepseek-v3", 256, 16, 256);
  for (int t : {1, 9, 40}) {
    EXPECT_TRUE(plan_runs(spec, t, FuseShared::Auto, with(base, &O::half_items_per_cta, 2),
                          "bulk_gate_up_half_items"))
        << "T=" << t;
    EXPECT_FALSE(plan_runs(spec, t, FuseShared::Auto, off, "bulk_gate_up_half_items")) << "T=" << t;
  }
  SKIP_WITHOUT_GPU();
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 37);
  for (int n : {2, 16}) {
    expect_knob_keeps_the_output_both(spec, *w, opt, off, with(base, &O::half_items_per_cta, n),
                                      "half_items_per_cta=" + std::to_string(n), {1, 9, 40}, 100);
  }
}

// No routing kernel at one token (self_route_tokens=1): the gate/up kernel routes its token from
// the logits and its CTA 0 writes the routing and dispatch for the down kernel. Against the
// routing kernel's path, with two forwards at one token (the second claims its dynamic tail from
// the work counter the first left zeroed) before and one after a forward at 9 tokens in the same
// layer; models without shared experts: softmax + renormalise (Qwen3), router bias + softmax of
// the top-k + clamped SwiGLU (gpt-oss), 8 experts (Mixtral). 3 launches at one token, 4 at two.
TEST(GpuLayerSmall, SelfRoutedGateUpAtOneToken) {
  const cuda::GpuLayerOptions opt = base_options(9);
  const O off = with(bulk(opt.overrides), &O::self_route_tokens, 0);
  const O on = with(bulk(opt.overrides), &O::self_route_tokens, 1);
  const char* const models[] = {"qwen3-30b-a3b", "gpt-oss-120b", "mixtral-8x7b"};
  auto spec_of = [](const std::string& model) {
    return small_spec(model, 256, model == "mixtral-8x7b" ? 8 : 16, 128);
  };
  for (const char* model : models) {
    const MoeSpec spec = spec_of(model);
    ASSERT_EQ(spec.shared_slots(), 0) << model;
    EXPECT_TRUE(plan_runs(spec, 1, FuseShared::Auto, on, "bulk_gate_up_one_token_self_route"));
    EXPECT_FALSE(sm90_plan(spec, 1, FuseShared::Auto, on).routing_kernel) << model;
    EXPECT_TRUE(sm90_plan(spec, 1, FuseShared::Auto, off).routing_kernel) << model;
    EXPECT_TRUE(sm90_plan(spec, 9, FuseShared::Auto, on).routing_kernel) << model;
    EXPECT_EQ(plan::own_launches(sm90_plan(spec, 1, FuseShared::Auto, on)), 3) << model;
    EXPECT_EQ(plan::own_launches(sm90_plan(spec, 2, FuseShared::Auto, on)), 4) << model;
  }
  SKIP_WITHOUT_GPU();
  for (const char* model : models) {
    const MoeSpec spec = spec_of(model);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 43);
    expect_knob_keeps_the_output(spec, *w, opt, off, on, "self_route_tokens=1", {1, 1, 9, 1},
                                 FuseShared::Auto, 120);
    const auto gpu = create_with(*w, opt, on);
    EXPECT_EQ(gpu->count_launches(1, false).kernels, 3) << model;
    EXPECT_EQ(gpu->count_launches(2, false).kernels, 4) << model;
  }
}

// The same with the shared experts fused (FuseShared::On; the producers issue the shared slots'
// tasks before the wait, the routed ones after their own routing): a gated shared expert
// (Qwen2-57B: the gate logit's sigmoid in its slot weight), two shared slots (DeepSeek-V2-Lite),
// groups of 16 experts with a correction bias (DeepSeek-V3's family). Unfused, the routing
// kernel runs (the shared MLP's launches read its shared_scale and tasks).
TEST(GpuLayerSmall, SelfRoutedGateUpWithFusedSharedExperts) {
  const cuda::GpuLayerOptions opt = base_options(9);
  const O off = with(bulk(opt.overrides), &O::self_route_tokens, 0);
  const O on = with(bulk(opt.overrides), &O::self_route_tokens, 1);
  const char* const models[] = {"qwen2-57b-a14b", "deepseek-v2-lite", "deepseek-v3"};
  for (const char* model : models) {
    const MoeSpec spec = small_spec(model, 256, 128, 128);
    ASSERT_GT(spec.shared_slots(), 0) << model;
    EXPECT_TRUE(plan_runs(spec, 1, FuseShared::On, on, "bulk_gate_up_one_token_self_route"));
    EXPECT_FALSE(sm90_plan(spec, 1, FuseShared::On, on).routing_kernel) << model;
    EXPECT_EQ(sm90_plan(spec, 1, FuseShared::On, on).experts.front().early_shared,
              spec.shared_slots())
        << model;
    EXPECT_TRUE(sm90_plan(spec, 1, FuseShared::On, off).routing_kernel) << model;
    EXPECT_TRUE(sm90_plan(spec, 1, FuseShared::Off, on).routing_kernel) << model;
    EXPECT_EQ(plan::own_launches(sm90_plan(spec, 1, FuseShared::On, on)), 3) << model;
  }
  SKIP_WITHOUT_GPU();
  for (const char* model : models) {
    const MoeSpec spec = small_spec(model, 256, 128, 128);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 47);
    expect_knob_keeps_the_output(spec, *w, opt, off, on, "self_route_tokens=1", {1, 1, 9, 1},
                                 FuseShared::On, 130);
    EXPECT_EQ(create_with(*w, opt, on)->count_launches(1, true).kernels, 3) << model;
  }
}

}  // namespace
}  // namespace moekit
