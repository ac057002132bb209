// The GPU layer at real model shapes, for the paths the scaled-down shapes never take:
// DeepSeek-V3 (its 22.6 GB layer made on the GPU) at 1, 7 and 9 tokens, and Qwen3-30B-A3B's
// down kernel on whole output tiles. Each asserts its plan on the "sm90" profile first.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "knob_test_util.h"
#include "layer_test_util.h"
#include "moekit/cuda_layer.h"
#include "moekit/plan.h"
#include "moekit/spec.h"

namespace moekit {
namespace {

using namespace moekit::test;
using O = plan::PlanOverrides;

// auto: fused up to 16 tokens; from 17 its slots would read the 88 MB of shared weights three
// times (the dense shared MLP exists from 8 tokens, so at 9 too). At 9 tokens the down kernel's
// dynamic tail (hidden 7168) and, unfused, the dense shared MLP.
TEST(GpuLayerRealShape, DeepSeekV3MatchesCpuReference) {
  const MoeSpec spec = load_spec("deepseek-v3");
  const cuda::GpuLayerOptions opt = base_options(9);
  const O none;  // the rules' own choice of fusion (the environment may move the dense limit)
  EXPECT_TRUE(sm90_plan(spec, 9, FuseShared::Auto, none).fused);
  EXPECT_TRUE(sm90_plan(spec, 16, FuseShared::Auto, none).fused);
  EXPECT_FALSE(sm90_plan(spec, 17, FuseShared::Auto, none).fused);
  EXPECT_TRUE(plan_runs(spec, 1, FuseShared::On, none, "bulk_gate_up_one_token"));
  EXPECT_TRUE(plan_runs(spec, 1, FuseShared::On, none, "bulk_down_one_token"));
  EXPECT_TRUE(plan_runs(spec, 7, FuseShared::On, none, "bulk_gate_up_weights_only"));
  EXPECT_TRUE(plan_runs(spec, 7, FuseShared::On, none, "bulk_down_weights_only_tail"));
  EXPECT_TRUE(sm90_plan(spec, 9, FuseShared::Off, none).dense_shared);
  SKIP_WITHOUT_GPU();
  const int layer = spec.moe_layers.front();
  const auto gpu = cuda::GpuMoeLayer::create_random(spec, layer, 21, opt);
  const auto w = make_random_weights(spec, layer, 21);  // lazy: only touched experts are made
  if (opt.overrides == O{}) {
    EXPECT_TRUE(gpu->resolve_fused(FuseShared::Auto, 16));
    EXPECT_FALSE(gpu->resolve_fused(FuseShared::Auto, 17));
  }
  for (int tokens : {1, 7, 9}) {
    const std::vector<Bf16> x = random_x(tokens, spec.hidden, 30 + tokens);
    for (FuseShared fuse : {FuseShared::On, FuseShared::Off}) {
      std::ostringstream what;
      what << "deepseek-v3 T=" << tokens << " fuse=" << fuse_shared_name(fuse);
      SCOPED_TRACE(what.str());
      expect_layer_runs_its_plan(*gpu, spec, tokens, fuse, opt.overrides, what.str());
      const ForwardResult g = gpu->forward(x.data(), tokens, fuse);
      expect_routing_matches_cpu(spec, *w, gpu->last_logits(tokens), g, what.str());
      expect_layer_matches_cpu(spec, *w, x.data(), tokens, g, fuse, what.str());
    }
  }
}

// Qwen3-30B-A3B's 128 output tiles of the down GEMM fit the H200's 132 SMs, so at <= 4 tokens
// the bulk down kernel runs one CTA per whole tile (whole_tile_tokens): against the CPU
// reference and bit for bit equal to the resident grid, whose tiles straddle CTAs.
TEST(GpuLayerRealShape, Qwen3WholeTileDownMatchesCpuReference) {
  const MoeSpec spec = load_spec("qwen3-30b-a3b");
  const cuda::GpuLayerOptions opt = base_options(8);
  const O off = with(bulk(opt.overrides), &O::whole_tile_tokens, 0);
  const O on = with(bulk(opt.overrides), &O::whole_tile_tokens, 8);
  for (int t : {1, 2, 4, 7}) {
    EXPECT_EQ(sm90_plan(spec, t, FuseShared::Off, on).experts.back().grid, 128) << "T=" << t;
    EXPECT_EQ(sm90_plan(spec, t, FuseShared::Off, off).experts.back().grid, 132) << "T=" << t;
  }
  SKIP_WITHOUT_GPU();
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 23);
  expect_knob_keeps_the_output(spec, *w, opt, off, on, "whole_tile_tokens=8", {1, 2, 4, 7},
                               FuseShared::Off, 40);
}

}  // namespace
}  // namespace moekit
