// The GPU layer's ring knobs at small shapes (as test_layer_small.cpp: the plans first, by
// kernel name, then on the GPU against the CPU reference and bit for bit against the other
// setting): the one-token rings, the ring of weights only, tasks of 16 tokens, the L2 keep,
// the down kernel's dynamic tail, and the dense shared MLP.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "knob_test_util.h"
#include "layer_test_util.h"
#include "moekit/cuda_layer.h"
#include "moekit/plan.h"

namespace moekit {
namespace {

using namespace moekit::test;
using O = plan::PlanOverrides;

// The one-token rings against the rings they replace (a warp takes the same k blocks in the
// same order): Qwen3-30B-A3B's down rows of 1.5 KB (one copy per tile) and its self-routing
// gate/up at hidden 2048, 256 and 2240; DeepSeek-V3's 4 KB down rows (one 64 KB copy per tile,
// in place of the split copies) and, with the routing kernel before it (self_route_tokens=0),
// its gate/up at 2240 (at 256, one chunk, the standard ring), fused and unfused; then with half
// items forced. At 2 tokens the rings are off in both layers; one token again after it (the buffers
// reused).
TEST(GpuLayerSmall, OneTokenRings) {
  const cuda::GpuLayerOptions opt = base_options(8);
  const O off = with(bulk(opt.overrides), &O::one_token_rings, 0);
  const O on = with(bulk(opt.overrides), &O::one_token_rings, 1);
  const O halves = with(bulk(opt.overrides), &O::half_items_per_cta, 1);
  const O halves_off = with(halves, &O::one_token_rings, 0);
  const O halves_on = with(halves, &O::one_token_rings, 1);
  const O routed_off = with(off, &O::self_route_tokens, 0);
  const O routed_on = with(on, &O::self_route_tokens, 0);
  for (int hidden : {2048, 256, 2240}) {
    const MoeSpec spec = small_spec("qwen3-30b-a3b", hidden, 16, 768);
    EXPECT_TRUE(plan_runs(spec, 1, FuseShared::Auto, on, "bulk_gate_up_one_token_self_route"));
    EXPECT_TRUE(plan_runs(spec, 1, FuseShared::Auto, on, "bulk_down_one_token_narrow"));
    EXPECT_TRUE(plan_runs(spec, 1, FuseShared::Auto, off, "bulk_gate_up_self_route"));
    EXPECT_TRUE(plan_runs(spec, 1, FuseShared::Auto, off, "bulk_down_deep"));
    EXPECT_EQ(plan_kernel_names(sm90_plan(spec, 2, FuseShared::Auto, on)),
              plan_kernel_names(sm90_plan(spec, 2, FuseShared::Auto, off)));
  }
  const MoeSpec ds2240 = small_spec("deepseek-v3", 2240, 16, 2048);
  for (FuseShared fuse : {FuseShared::On, FuseShared::Off}) {
    EXPECT_TRUE(plan_runs(ds2240, 1, fuse, routed_on, "bulk_gate_up_one_token"));
    EXPECT_TRUE(plan_runs(ds2240, 1, fuse, routed_on, "bulk_down_one_token"));
    EXPECT_TRUE(plan_runs(ds2240, 1, fuse, routed_off, "bulk_down_split_rows"));
  }
  EXPECT_FALSE(plan_runs(small_spec("deepseek-v3", 256, 16, 2048), 1, FuseShared::On, routed_on,
                         "bulk_gate_up_one_token"));
  const MoeSpec narrow = small_spec("deepseek-v3", 2240, 16, 256);
  EXPECT_TRUE(plan_runs(narrow, 1, FuseShared::On, halves_on, "bulk_gate_up_one_token_half_items"));
  EXPECT_TRUE(plan_runs(narrow, 1, FuseShared::On, halves_off, "bulk_gate_up_half_items"));
  SKIP_WITHOUT_GPU();
  for (int hidden : {2048, 256, 2240}) {
    const MoeSpec spec = small_spec("qwen3-30b-a3b", hidden, 16, 768);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 37);
    expect_knob_keeps_the_output(spec, *w, opt, off, on, "one_token_rings=1", {1, 2, 1},
                                 FuseShared::Auto, 95);
  }
  for (int hidden : {256, 2240}) {
    const MoeSpec spec = small_spec("deepseek-v3", hidden, 16, 2048);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 41);
    expect_knob_keeps_the_output_both(spec, *w, opt, routed_off, routed_on,
                                      "self_route_tokens=0 one_token_rings=1", {1, 2, 1}, 105);
  }
  const auto w = make_random_weights(narrow, narrow.moe_layers.front(), 43);
  expect_knob_keeps_the_output_both(narrow, *w, opt, halves_off, halves_on,
                                    "one_token_rings=1 half_items_per_cta=1", {1, 2, 1}, 110);
}

// Both bulk kernels' ring of weights only (weights_only_tokens; the consumers load their
// activation fragments from L2; the k blocks and their order per warp are the standard ring's,
// the deep ring's, the split copies' and the half items', so bit for bit the same output), with
// tasks of 16 off (they run the ring of weights only at 32 tokens in both layers otherwise).
// Gate/up rows of one chunk (hidden 256) and of several with a narrower last one (2240); down rows
// of 3 and 4 KB, and Qwen3-30B-A3B's 1.5 KB (the deep ring when off); fused and unfused; then
// with its dynamic-tail and L2-keeping twins forced.
TEST(GpuLayerSmall, BulkWeightsOnlyRing) {
  const cuda::GpuLayerOptions opt = base_options(32);
  const O base = with(bulk(opt.overrides), &O::task16_from, 0);
  const O off = with(base, &O::weights_only_tokens, 0);
  const O on = with(base, &O::weights_only_tokens, 32);
  const O tail = with(base, &O::down_tail_percent, 50);
  const O keep = with(tail, &O::l2_keep_from_tokens, 1);
  const MoeSpec ds = small_spec("deepseek-v3", 2240, 16, 2048);
  for (int t : {2, 7, 32}) {
    EXPECT_TRUE(plan_runs(ds, t, FuseShared::Auto, on, "bulk_gate_up_weights_only")) << t;
    EXPECT_TRUE(plan_runs(ds, t, FuseShared::Auto, on, "bulk_down_weights_only")) << t;
    EXPECT_FALSE(plan_runs(ds, t, FuseShared::Auto, off, "bulk_down_weights_only")) << t;
  }
  EXPECT_TRUE(plan_runs(ds, 2, FuseShared::Auto, off, "bulk_down_split_rows"));
  const MoeSpec qwen = small_spec("qwen3-30b-a3b", 2048, 16, 768);
  EXPECT_TRUE(plan_runs(qwen, 8, FuseShared::Auto, on, "bulk_down_weights_only"));
  EXPECT_TRUE(plan_runs(qwen, 8, FuseShared::Auto, off, "bulk_down_deep"));
  for (int t : {2, 9, 32}) {
    EXPECT_TRUE(plan_runs(ds, t, FuseShared::Auto, with(tail, &O::weights_only_tokens, 32),
                          "bulk_down_weights_only_tail")) << t;
    EXPECT_FALSE(plan_runs(ds, t, FuseShared::Auto, with(tail, &O::weights_only_tokens, 0),
                           "bulk_down_weights_only_tail")) << t;
  }
  for (int t : {9, 32}) {
    const O keep_on = with(keep, &O::weights_only_tokens, 32);
    EXPECT_TRUE(plan_runs(ds, t, FuseShared::On, keep_on, "bulk_gate_up_weights_only_l2_keep"));
    EXPECT_TRUE(plan_runs(ds, t, FuseShared::On, keep_on, "bulk_down_weights_only_l2_keep_tail"));
    EXPECT_TRUE(plan_runs(ds, t, FuseShared::On, with(keep, &O::weights_only_tokens, 0),
                          "bulk_down_l2_keep_tail"));
  }
  SKIP_WITHOUT_GPU();
  for (int hidden : {256, 2240}) {
    for (int inter : {1536, 2048}) {
      const MoeSpec spec = small_spec("deepseek-v3", hidden, 16, inter);
      const auto w = make_random_weights(spec, spec.moe_layers.front(), 47);
      expect_knob_keeps_the_output_both(spec, *w, opt, off, on, "weights_only_tokens=32",
                                        {2, 7, 32}, 120);
    }
  }
  const auto wq = make_random_weights(qwen, qwen.moe_layers.front(), 53);
  expect_knob_keeps_the_output(qwen, *wq, opt, off, on, "weights_only_tokens=32", {8, 32},
                               FuseShared::Auto, 125);
  const auto w = make_random_weights(ds, ds.moe_layers.front(), 59);
  expect_knob_keeps_the_output_both(ds, *w, opt, with(tail, &O::weights_only_tokens, 0),
                                    with(tail, &O::weights_only_tokens, 32),
                                    "weights_only_tokens=32 down_tail_percent=50", {2, 9, 32}, 130);
  expect_knob_keeps_the_output(ds, *w, opt, with(keep, &O::weights_only_tokens, 0),
                               with(keep, &O::weights_only_tokens, 32),
                               "weights_only_tokens=32 down_tail_percent=50 l2_keep_from_tokens=1",
                               {9, 32}, FuseShared::On, 135);
}

// The ring of weights only and its twins at shapes small enough for racecheck: 512 gate/up and
// 256 down items of 16 rows over the 132 CTAs at 9 and 40 tokens, so each CTA's 3 stages wrap
// around; then down rows of two chunks (5 KB) over 4 experts.
TEST(GpuLayerSmall, BulkWeightsOnlyRingSanitizerShapes) {
  const cuda::GpuLayerOptions opt = base_options(40);
  const O base = with(bulk(opt.overrides), &O::task16_from, 0);
  const O off = with(base, &O::weights_only_tokens, 0);
  const O on = with(base, &O::weights_only_tokens, 40);
  const O twins = with(with(base, &O::down_tail_percent, 50), &O::l2_keep_from_tokens, 1);
  const MoeSpec spec = small_spec("deepseek-v3", 256, 16, 256);
  for (int t : {9, 40}) {
    EXPECT_TRUE(plan_runs(spec, t, FuseShared::Auto, on, "bulk_down_weights_only")) << t;
    EXPECT_TRUE(plan_runs(spec, t, FuseShared::Auto, off, "bulk_down")) << t;
    EXPECT_TRUE(plan_runs(spec, t, FuseShared::On, with(twins, &O::weights_only_tokens, 40),
                          "bulk_down_weights_only_l2_keep_tail")) << t;
  }
  const MoeSpec wide = small_spec("gpt-oss-120b", 256, 4, 2560);
  for (int t : {2, 9}) {
    EXPECT_TRUE(plan_runs(wide, t, FuseShared::Off, on, "bulk_down_weights_only")) << t;
    EXPECT_TRUE(plan_runs(wide, t, FuseShared::Off, off, "bulk_down")) << t;
  }
  SKIP_WITHOUT_GPU();
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 61);
  expect_knob_keeps_the_output_both(spec, *w, opt, off, on, "weights_only_tokens=40", {9, 40}, 140);
  expect_knob_keeps_the_output(spec, *w, opt, with(twins, &O::weights_only_tokens, 0),
                               with(twins, &O::weights_only_tokens, 40),
                               "weights_only_tokens=40 down_tail_percent=50 l2_keep_from_tokens=1",
                               {9, 40}, FuseShared::On, 145);
  const auto ww = make_random_weights(wide, wide.moe_layers.front(), 63);
  expect_knob_keeps_the_output(wide, *ww, opt, off, on, "weights_only_tokens=40", {2, 9},
                               FuseShared::Off, 147);
}

// The ring of weights only for down rows of more than 4 KB, two and seven 4 KB chunks a row
// (gpt-oss-120b's 5.6 KB with its clamped activation and biases, Qwen2-57B-A14B's 5 KB with its
// gated shared expert, Mixtral's 28 KB), the last chunk narrower; then with the down tail forced
// and gate/up rows of several chunks too.
TEST(GpuLayerSmall, BulkWeightsOnlyRingWideRows) {
  const cuda::GpuLayerOptions opt = base_options(16);
  const O base = with(bulk(opt.overrides), &O::task16_from, 0);
  const O off = with(base, &O::weights_only_tokens, 0);
  const O on = with(base, &O::weights_only_tokens, 16);
  const O tail = with(base, &O::down_tail_percent, 50);
  const std::pair<const char*, int> shapes[] = {
      {"gpt-oss-120b", 2880}, {"qwen2-57b-a14b", 2560}, {"mixtral-8x7b", 14336}};
  for (const auto& [model, inter] : shapes) {
    const MoeSpec spec = small_spec(model, 256, 16, inter);
    for (int t : {2, 7, 16}) {
      EXPECT_TRUE(plan_runs(spec, t, FuseShared::Off, on, "bulk_down_weights_only")) << t;
      EXPECT_TRUE(plan_runs(spec, t, FuseShared::Off, off, "bulk_down")) << t;
    }
  }
  const MoeSpec qwen2 = small_spec("qwen2-57b-a14b", 2240, 16, 2560);
  for (int t : {2, 9, 16}) {
    EXPECT_TRUE(plan_runs(qwen2, t, FuseShared::Off, with(tail, &O::weights_only_tokens, 16),
                          "bulk_down_weights_only_tail")) << t;
    EXPECT_TRUE(plan_runs(qwen2, t, FuseShared::Off, with(tail, &O::weights_only_tokens, 0),
                          "bulk_down_tail")) << t;
  }
  SKIP_WITHOUT_GPU();
  for (const auto& [model, inter] : shapes) {
    SCOPED_TRACE(model);
    const MoeSpec spec = small_spec(model, 256, 16, inter);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 67);
    for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
      if (fuse == FuseShared::Auto && spec.shared_intermediate == 0) continue;  // (the same path)
      expect_knob_keeps_the_output(spec, *w, opt, off, on, "weights_only_tokens=16", {2, 7, 16},
                                   fuse, 150);
    }
  }
  const auto w = make_random_weights(qwen2, qwen2.moe_layers.front(), 71);
  expect_knob_keeps_the_output_both(qwen2, *w, opt, with(tail, &O::weights_only_tokens, 0),
                                    with(tail, &O::weights_only_tokens, 16),
                                    "weights_only_tokens=16 down_tail_percent=50", {2, 9, 16}, 155);
}

// Both bulk kernels' tasks of up to 16 tokens (task16_from; chunk 16 through the ring of weights
// only, each consumer warp running both n-tiles on every weight fragment) against tasks of 8
// (per token the same k blocks in the same order per warp). 16 experts: at 9 tokens tasks of
// 1-8 tokens (the second n-tile idle), at 40 of 16 and a rest, the fused shared expert's of 16,
// 16 and 8; rows of one 512-byte chunk; then wider rows: gate/up rows of several 4 KB chunks
// with a narrower last (hidden 2240) beside down rows of one, and down rows of several
// (gpt-oss-120b, Qwen2-57B-A14B's gated shared expert as two slots, Mixtral over 8 experts).
TEST(GpuLayerSmall, BulkTasksOf16Tokens) {
  const cuda::GpuLayerOptions opt = base_options(40);
  const O off = with(bulk(opt.overrides), &O::task16_from, 0);
  const O on = with(bulk(opt.overrides), &O::task16_from, 1);
  const std::tuple<const char*, int, int, int> shapes[] = {{"deepseek-v3", 256, 16, 256},
                                                           {"deepseek-v3", 2240, 16, 2048},
                                                           {"gpt-oss-120b", 256, 16, 2880},
                                                           {"qwen2-57b-a14b", 256, 16, 2560},
                                                           {"mixtral-8x7b", 256, 8, 14336}};
  for (const auto& [model, hidden, experts, inter] : shapes) {
    const MoeSpec spec = small_spec(model, hidden, experts, inter);
    for (int t : {9, 16, 40}) {
      EXPECT_TRUE(plan_runs(spec, t, FuseShared::Off, on, "bulk_gate_up_16_weights_only")) << t;
      EXPECT_TRUE(plan_runs(spec, t, FuseShared::Off, on, "bulk_down_16_weights_only")) << t;
      EXPECT_EQ(sm90_plan(spec, t, FuseShared::Off, off).chunk, 8) << model << " T=" << t;
    }
  }
  SKIP_WITHOUT_GPU();
  for (const auto& [model, hidden, experts, inter] : shapes) {
    SCOPED_TRACE(model);
    const MoeSpec spec = small_spec(model, hidden, experts, inter);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 79);
    expect_knob_keeps_the_output_both(spec, *w, opt, off, on, "task16_from=1", {9, 16, 40}, 170);
  }
}

// The bulk kernels' instances that keep weight rows read again by the expert's next task in L2
// (l2_keep_from_tokens, forced from 1 token at this small hidden size): a cache hint only, so
// bit for bit the same output; at 40 tokens over 16 experts most experts have two tasks (tasks of
// 16 off: they keep nothing), the fused shared expert five; fused and unfused.
TEST(GpuLayerSmall, BulkL2KeepForExpertsWithSeveralTasks) {
  const cuda::GpuLayerOptions opt = base_options(40);
  const O base = with(bulk(opt.overrides), &O::task16_from, 0);
  const O off = with(base, &O::l2_keep_from_tokens, 0);
  const O on = with(base, &O::l2_keep_from_tokens, 1);
  const MoeSpec spec = small_spec("deepseek-v3", 256, 16, 256);
  for (int t : {1, 9, 40}) {
    EXPECT_TRUE(plan_runs(spec, t, FuseShared::On, on, "bulk_gate_up_l2_keep")) << t;
    EXPECT_FALSE(plan_runs(spec, t, FuseShared::On, off, "bulk_gate_up_l2_keep")) << t;
  }
  for (int t : {9, 40}) EXPECT_TRUE(plan_runs(spec, t, FuseShared::On, on, "bulk_down_l2_keep"));
  SKIP_WITHOUT_GPU();
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 29);
  expect_knob_keeps_the_output_both(spec, *w, opt, off, on, "l2_keep_from_tokens=1", {1, 9, 40}, 80);
}

// The bulk down kernel's dynamic tail (the last tiles' items claimed one by one, combined after
// every CTA has written its partials) against static ranges (each output the same slot-ordered
// sum). 256 rows are 16 tiles: 50% makes 8 tail tiles, 100% leaves no static items; with the
// L2-keeping instance too; tasks of 16 off (no tail instance); fused and unfused.
TEST(GpuLayerSmall, BulkDownDynamicTailTiles) {
  const cuda::GpuLayerOptions opt = base_options(40);
  const O base = with(bulk(opt.overrides), &O::task16_from, 0);
  const O off = with(base, &O::down_tail_percent, 0);
  const O keep = with(base, &O::l2_keep_from_tokens, 1);
  const MoeSpec spec = small_spec("deepseek-v3", 256, 16, 256);
  for (int t : {1, 9, 40}) {
    EXPECT_TRUE(plan_runs(spec, t, FuseShared::On, with(base, &O::down_tail_percent, 50),
                          "bulk_down_tail")) << t;
    EXPECT_FALSE(plan_runs(spec, t, FuseShared::On, off, "bulk_down_tail")) << t;
  }
  for (int t : {9, 40}) {
    EXPECT_TRUE(plan_runs(spec, t, FuseShared::On, with(keep, &O::down_tail_percent, 50),
                          "bulk_down_l2_keep_tail")) << t;
  }
  SKIP_WITHOUT_GPU();
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 31);
  for (int tail : {50, 100}) {
    expect_knob_keeps_the_output_both(spec, *w, opt, off, with(base, &O::down_tail_percent, tail),
                                      "down_tail_percent=" + std::to_string(tail), {1, 9, 40}, 90);
  }
  expect_knob_keeps_the_output(spec, *w, opt, with(keep, &O::down_tail_percent, 0),
                               with(keep, &O::down_tail_percent, 50),
                               "down_tail_percent=50 l2_keep_from_tokens=1", {9, 40},
                               FuseShared::On, 95);
}

// The unfused shared MLP as dense cuBLAS GEMMs (shared_dense_tokens) for each kind of shared
// expert: DeepSeek-V3's (SiLU), DeepSeek-V4-Flash's (clamped SiLU), Qwen2-57B-A14B's
// (sigmoid-gated, twice the routed width) and MiniMax-M3's (swigluoai). Against the CPU reference
// (the sums' order differs from the expert kernels', so not bit for bit), below and from its
// token limit, and captured in a CUDA graph (cuBLAS with its fixed workspace).
TEST(GpuLayerSmall, SharedDenseMlp) {
  const cuda::GpuLayerOptions opt = base_options(40);
  const O dense = with(opt.overrides, &O::shared_dense_tokens, 9);
  const O never = with(opt.overrides, &O::shared_dense_tokens, 0);
  const char* const models[] = {"deepseek-v3", "deepseek-v4-flash", "qwen2-57b-a14b", "minimax-m3"};
  for (const char* model : models) {
    const MoeSpec spec = small_spec(model, 256, 16, 128);
    ASSERT_GT(spec.shared_intermediate, 0) << model;
    EXPECT_FALSE(sm90_plan(spec, 1, FuseShared::Off, dense).dense_shared) << model;
    for (int t : {9, 40}) {
      const plan::LayerPlan p = sm90_plan(spec, t, FuseShared::Off, dense);
      EXPECT_TRUE(p.dense_shared) << plan::describe(p);
      EXPECT_EQ(p.experts.size(), 2u) << "no shared expert launches:\n" << plan::describe(p);
      EXPECT_FALSE(sm90_plan(spec, t, FuseShared::Off, never).dense_shared) << model;
    }
  }
  SKIP_WITHOUT_GPU();
  for (const char* model : models) {
    SCOPED_TRACE(model);
    const MoeSpec spec = small_spec(model, 256, 16, 128);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 73);
    const auto gpu = create_with(*w, opt, dense);
    for (int t : {1, 9, 40}) {
      const std::vector<Bf16> x = random_x(t, spec.hidden, 160 + t);
      const ForwardResult g = gpu->forward(x.data(), t, FuseShared::Off);
      expect_layer_matches_cpu(spec, *w, x.data(), t, g, FuseShared::Off,
                               spec.name + " T=" + std::to_string(t) + " shared_dense_tokens=9");
    }
    expect_graph_replay_equals_forward(*gpu, spec, 40, FuseShared::Off, 165);
    // cuBLAS' GEMMs (>= 1 kernel each) and the activation kernel in place of two expert kernels
    const auto plain = create_with(*w, opt, never);
    EXPECT_GE(gpu->count_launches(40, false).kernels, plain->count_launches(40, false).kernels + 1);
  }
}

}  // namespace
}  // namespace moekit
