// The GPU layer on fp8 block-scale experts (GpuLayerOptions::expert_dtype F8_E4M3: W8A8 on the
// bulk kernels' fp8 instances): tiny fp8 checkpoints in the real tensor names (written by the
// project's writer, tests/fp8_test_util.h), loaded as fp8, run on the GPU and compared with the
// CPU reference's W8A8 forward on the same bytes; the plans (fp8 instances in every launch, the
// shared expert fused), CUDA-graph replay, and the errors of what the fp8 layer cannot run.
// GpuFp8Small.* runs under scripts/gpu_check.sh's sanitizers.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../expect_error.h"
#include "../fp8_test_util.h"
#include "../io_test_util.h"
#include "../shrunk_spec.h"
#include "knob_test_util.h"
#include "layer_test_util.h"
#include "moekit/cuda_layer.h"
#include "moekit/layer.h"
#include "moekit/plan.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

using namespace moekit::test;
using O = plan::PlanOverrides;

// The fp8 load of a freshly written fp8 checkpoint of `spec`'s first MoE layer.
std::unique_ptr<LayerWeights> fp8_layer(const MoeSpec& spec, uint64_t seed,
                                        const std::string& tag) {
  const std::string dir = scratch_dir(tag);
  write_fp8_checkpoint(spec, spec.moe_layers.front(), seed, false, dir);
  LoadOptions lo;
  lo.expert_format = ExpertFormat::Fp8Block;
  return load_checkpoint_weights(spec, spec.moe_layers.front(), dir, lo);
}

plan::LayerPlan sm90_fp8_plan(const MoeSpec& spec, int tokens, const O& o) {
  return plan::plan_layer(spec, tokens, FuseShared::Auto, o, plan::device_profile("sm90"),
                          DType::F8_E4M3);
}

// Every expert launch of an fp8 plan is an fp8 instance, and the shared expert runs fused.
void expect_fp8_plan(const MoeSpec& spec, int tokens, const O& o, const std::string& what) {
  const plan::LayerPlan p = sm90_fp8_plan(spec, tokens, o);
  EXPECT_TRUE(p.fp8) << what;
  if (spec.shared_kind != SharedKind::None) EXPECT_TRUE(p.fused) << what;
  ASSERT_EQ(p.stream, plan::Stream::Bulk) << what;
  for (const plan::ExpertLaunch& l : p.experts) {
    EXPECT_TRUE(plan::expert_kernels()[l.kernel].fp8)
        << what << " " << l.role << ": " << plan::expert_kernels()[l.kernel].name;
  }
}

struct Fp8Case {
  const char* model;
  int hidden, inter, experts;
};

// DeepSeek-V3 (sigmoid + bias, groups, one shared slot), Kimi-K2 (one group), MiniMax-M2 (no
// shared expert) and DeepSeek-V4-Flash (ue8m0 scales), H and I multiples of 128. At one token
// DeepSeek-V3's H and I, multiples of 512, take the fp8 one-token rings; the others' the rings
// of weights only (plan::experts_fp8_one_token_ring).
const Fp8Case kCases[] = {{"deepseek-v3", 512, 512, 16},
                          {"kimi-k2", 384, 128, 16},
                          {"minimax-m2", 384, 256, 16},
                          {"deepseek-v4-flash", 256, 128, 16}};

// Token counts over the fp8 instances: one token, tasks of 8 (the down kernel's tail forced at
// one of them), tasks of 16 (from 16 tokens: 8 routed tokens per expert); the prefill path off.
TEST(GpuFp8, DecodeMatchesTheCpuReferenceW8A8) {
  O base = plan::plan_overrides_from_env();
  base.grouped_from_tokens = 0;
  for (const Fp8Case& c : kCases) {
    const MoeSpec spec = shrunk_spec(c.model, c.hidden, c.inter, c.experts);
    for (int tokens : {1, 5, 8, 40, 100}) expect_fp8_plan(spec, tokens, base, spec.name);
  }
  if (base.one_token_rings != 0) {
    const plan::LayerPlan one = sm90_fp8_plan(shrunk_spec("deepseek-v3", 512, 512, 16), 1, base);
    for (const plan::ExpertLaunch& l : one.experts) {
      const std::string name = plan::expert_kernels()[l.kernel].name;
      EXPECT_NE(name.find("one_token"), std::string::npos) << l.role << ": " << name;
    }
  }
  SKIP_WITHOUT_GPU();
  for (const Fp8Case& c : kCases) {
    const MoeSpec spec = shrunk_spec(c.model, c.hidden, c.inter, c.experts);
    const auto w = fp8_layer(spec, 7, c.model);
    ASSERT_EQ(w->expert_dtype(), DType::F8_E4M3);
    for (const int down_tail : {-1, 20}) {
      O o = base;
      o.down_tail_percent = down_tail;
      cuda::GpuLayerOptions opt = base_options(100);
      opt.overrides = o;
      const auto gpu = cuda::GpuMoeLayer::create(*w, opt);
      for (int tokens : {1, 5, 8, 40, 100}) {
        if (down_tail > 0 && tokens > 8) continue;  // (the tail instance: tasks of 8)
        std::ostringstream what;
        what << spec.name << " fp8 T=" << tokens << " down_tail=" << down_tail;
        expect_fp8_plan(spec, tokens, o, what.str());
        const std::vector<Bf16> x = random_x(tokens, spec.hidden, 11 + tokens);
        const ForwardResult g = gpu->forward(x.data(), tokens, FuseShared::Auto);
        expect_routing_matches_cpu(spec, *w, gpu->last_logits(tokens), g, what.str());
        const ForwardResult r =
            cpu_reference::forward(*w, x.data(), tokens, FuseShared::Auto, Fp8Compute::W8A8);
        expect_layer_matches(spec, tokens, g, r, what.str());
      }
    }
  }
}

// No routing kernel at one token in the fp8 one-token gate/up ring (self_route_tokens=1, E <=
// 256): the gate/up kernel routes its token and its CTA 0 writes the dispatch. MiniMax-M2's
// family with 192 experts (no shared expert, 6 a lane) and DeepSeek-V3's with its 256 experts in
// groups of 8 and the shared expert fused (its slot's task after the routed ones, issued before
// the wait). Against the routing kernel's path bit for bit and the CPU reference, two forwards
// at one token (the second claims from the counter the first left zeroed), one at 9 tokens, one
// token again; 5 launches at one token, 6 at two.
TEST(GpuFp8, SelfRoutedGateUpAtOneToken) {
  O base = plan::plan_overrides_from_env();
  base.grouped_from_tokens = 0;
  O on = base, off = base;
  on.self_route_tokens = 1;
  off.self_route_tokens = 0;
  const MoeSpec specs[] = {shrunk_spec("minimax-m2", 512, 128, 192),
                           shrunk_spec("deepseek-v3", 512, 128, 256)};
  ASSERT_EQ(specs[0].shared_slots(), 0);
  ASSERT_EQ(specs[1].shared_slots(), 1);
  for (const MoeSpec& spec : specs) {
    auto gate_up = [&](const O& o) {
      return std::string(
          plan::expert_kernels()[sm90_fp8_plan(spec, 1, o).experts.front().kernel].name);
    };
    EXPECT_EQ(gate_up(on), "bulk_gate_up_one_token_fp8_self_route") << spec.name;
    EXPECT_EQ(gate_up(off), "bulk_gate_up_one_token_fp8") << spec.name;
    EXPECT_FALSE(sm90_fp8_plan(spec, 1, on).routing_kernel) << spec.name;
    EXPECT_TRUE(sm90_fp8_plan(spec, 1, off).routing_kernel) << spec.name;
    EXPECT_EQ(sm90_fp8_plan(spec, 1, on).experts.front().early_shared, spec.shared_slots());
    EXPECT_EQ(plan::own_launches(sm90_fp8_plan(spec, 1, on)), 5) << spec.name;
    EXPECT_EQ(plan::own_launches(sm90_fp8_plan(spec, 2, on)), 6) << spec.name;
  }
  SKIP_WITHOUT_GPU();
  for (const MoeSpec& spec : specs) {
    const auto w = fp8_layer(spec, 13, "self_route");
    cuda::GpuLayerOptions opt = base_options(9);
    opt.overrides = on;
    const auto routed_here = cuda::GpuMoeLayer::create(*w, opt);
    opt.overrides = off;
    const auto routed_before = cuda::GpuMoeLayer::create(*w, opt);
    EXPECT_EQ(routed_here->count_launches(1, spec.shared_slots() > 0).kernels, 5) << spec.name;
    for (int tokens : {1, 1, 9, 1}) {
      const std::string what =
          spec.name + " fp8 T=" + std::to_string(tokens) + " self_route_tokens=1";
      const std::vector<Bf16> x = random_x(tokens, spec.hidden, 50 + tokens);
      const ForwardResult g = routed_here->forward(x.data(), tokens, FuseShared::Auto);
      expect_routing_matches_cpu(spec, *w, routed_here->last_logits(tokens), g, what);
      expect_layer_matches(
          spec, tokens, g,
          cpu_reference::forward(*w, x.data(), tokens, FuseShared::Auto, Fp8Compute::W8A8), what);
      EXPECT_EQ(routed_before->forward(x.data(), tokens, FuseShared::Auto).y, g.y) << what;
    }
  }
}

// The fp8 forward captured in a graph and replayed gives the eager forward bit for bit.
TEST(GpuFp8, GraphReplayEqualsTheEagerForward) {
  SKIP_WITHOUT_GPU();
  const MoeSpec spec = shrunk_spec("deepseek-v3", 512, 256, 16);
  const auto w = fp8_layer(spec, 3, "graph");
  cuda::GpuLayerOptions opt = base_options(32);
  opt.overrides.grouped_from_tokens = 0;
  const auto gpu = cuda::GpuMoeLayer::create(*w, opt);
  for (int tokens : {1, 32})
    expect_graph_replay_equals_forward(*gpu, spec, tokens, FuseShared::Auto, 5);
}

// Small shapes for the sanitizers: one token and tasks of 16, DeepSeek-V3's family.
TEST(GpuFp8Small, SanitizerShapes) {
  SKIP_WITHOUT_GPU();
  // (one token: the fp8 one-token rings; 24 tokens: the rings of weights only)
  const MoeSpec spec = shrunk_spec("deepseek-v3", 512, 512, 16);
  const auto w = fp8_layer(spec, 9, "small");
  cuda::GpuLayerOptions opt = base_options(24);
  opt.overrides.grouped_from_tokens = 0;
  const auto gpu = cuda::GpuMoeLayer::create(*w, opt);
  for (int tokens : {1, 24}) {
    const std::vector<Bf16> x = random_x(tokens, spec.hidden, tokens);
    const ForwardResult g = gpu->forward(x.data(), tokens, FuseShared::Auto);
    expect_layer_matches(
        spec, tokens, g,
        cpu_reference::forward(*w, x.data(), tokens, FuseShared::Auto, Fp8Compute::W8A8),
        spec.name + " fp8 T=" + std::to_string(tokens));
  }
}

// What the fp8 layer cannot run is an error naming it: the shared expert unfused, shapes off
// the 128 x 128 tiles, register kernels.
TEST(GpuFp8, WhatItCannotRunIsAClearError) {
  const MoeSpec ds = shrunk_spec("deepseek-v3", 512, 256, 16);
  expect_error(
      [&] {
        plan::plan_layer(ds, 4, FuseShared::Off, {}, plan::device_profile("sm90"), DType::F8_E4M3);
      },
      {"run the shared expert fused"});
  O regs;
  regs.stream = plan::Stream::Registers;
  expect_error([&] { sm90_fp8_plan(ds, 4, regs); }, {"fp8 experts run on the bulk"});
  SKIP_WITHOUT_GPU();
  const MoeSpec odd = shrunk_spec("minimax-m2", 192, 128, 8);
  cuda::GpuLayerOptions opt = base_options(4);
  opt.expert_dtype = DType::F8_E4M3;
  expect_error([&] { cuda::GpuMoeLayer::create_random(odd, odd.moe_layers.front(), 1, opt); },
               {"multiples of 128"});
  const auto w = fp8_layer(ds, 3, "bf16opt");
  cuda::GpuLayerOptions f8 = base_options(4);
  const auto gpu = cuda::GpuMoeLayer::create(*w, f8);  // (BF16 in the options: take the weights')
  const std::vector<Bf16> x = random_x(4, ds.hidden, 1);
  expect_error([&] { gpu->forward(x.data(), 4, FuseShared::Off); },
               {"run the shared expert fused"});
}

}  // namespace
}  // namespace moekit
