// The layer plan for OCP MX experts (plan_layer's `mx`, docs/decisions/mx_experts.md), host-only:
// the MX instances in both expert launches on tasks of 8 tokens (no register kernels) up to the
// prefill rule, the prefill path from it (its GEMMs in runs of widened experts), the shared
// expert fused, no quantisers; what cannot be is an error.
#include <gtest/gtest.h>

#include <string>

#include "expect_error.h"
#include "moekit/plan.h"
#include "moekit/spec.h"
#include "plan/expert_kernels.h"
#include "plan/expert_rules.h"

namespace moekit::plan {
namespace {

LayerPlan mx_plan(const char* model, int tokens, ExpertFormat f, FuseShared fuse = FuseShared::Auto,
                  const PlanOverrides& o = {}) {
  return plan_layer(load_spec(model), tokens, fuse, o, device_profile("sm90"), DType::BF16, f);
}

std::string kernel_names(const LayerPlan& p) {
  std::string s;
  for (const ExpertLaunch& l : p.experts) s += std::string(expert_kernels()[l.kernel].name) + " ";
  return s;
}

TEST(PlanMx, DecodeBatchesRunTheMxInstancesOnTasksOf8) {
  // (the MX prefill rule: from 768 tokens for 128 experts of top-4)
  for (int tokens : {1, 32, 128, 767}) {
    const LayerPlan gpt = mx_plan("gpt-oss-120b", tokens, ExpertFormat::Mxfp4);
    EXPECT_EQ(gpt.stream, Stream::Bulk) << tokens;
    EXPECT_EQ(gpt.chunk, 8) << tokens;
    EXPECT_EQ(gpt.mx, ExpertFormat::Mxfp4);
    EXPECT_FALSE(gpt.fused);  // (no shared expert)
    // (one token: the gate/up kernel routes it, no routing kernel: experts_self_route.md; from
    // 8 tokens the consumer-groups instances, below)
    EXPECT_EQ(kernel_names(gpt), tokens == 1 ? "bulk_gate_up_mxfp4_self_route bulk_down_mxfp4 "
                                             : "bulk_gate_up_mxfp4_groups bulk_down_mxfp4_groups ")
        << tokens;
    // router, routing, two expert kernels
    EXPECT_EQ(own_launches(gpt), tokens == 1 ? 3 : 4) << tokens;
    const LayerPlan m3 = mx_plan("minimax-m3", tokens, ExpertFormat::Mxfp8);
    EXPECT_TRUE(m3.fused) << tokens;
    EXPECT_EQ(m3.slots, 5) << tokens;  // top-4 + the shared expert's one slot
    EXPECT_FALSE(m3.dense_shared);
    // (one token too: MX with a shared expert keeps its routing kernel, experts_self_route.md)
    EXPECT_EQ(kernel_names(m3), "bulk_gate_up_mxfp8 bulk_down_mxfp8 ") << tokens;
    EXPECT_TRUE(m3.routing_kernel) << tokens;
  }
  const LayerPlan p = mx_plan("minimax-m3", 32, ExpertFormat::Mxfp8);
  EXPECT_NE(describe(p).find("mxfp8 w8a16"), std::string::npos) << describe(p);
  EXPECT_NE(to_json(p).find("\"experts_dtype\":\"MXFP8\""), std::string::npos) << to_json(p);
  EXPECT_NE(describe(mx_plan("gpt-oss-120b", 1, ExpertFormat::Mxfp4)).find("mxfp4 w4a16"),
            std::string::npos);
}

// MXFP4's bulk kernels run their consumer warps as two groups taking alternate items from
// kMxGroupsTokens tokens (the _groups instances of both launches), the one-group instances below
// it and in every MXFP8 layer; MOEKIT_EXPERTS_MX_GROUPS moves the rule (0: never).
TEST(PlanMx, Mxfp4ConsumerGroupsFromTheirBatch) {
  for (int tokens : {1, 2, kMxGroupsTokens - 1, kMxGroupsTokens, 32, 128, 767}) {
    const LayerPlan gpt = mx_plan("gpt-oss-120b", tokens, ExpertFormat::Mxfp4);
    EXPECT_EQ(kernel_names(gpt), tokens == 1 ? "bulk_gate_up_mxfp4_self_route bulk_down_mxfp4 "
                                 : tokens >= kMxGroupsTokens
                                     ? "bulk_gate_up_mxfp4_groups bulk_down_mxfp4_groups "
                                     : "bulk_gate_up_mxfp4 bulk_down_mxfp4 ")
        << tokens;
    EXPECT_EQ(kernel_names(mx_plan("minimax-m3", tokens, ExpertFormat::Mxfp8)),
              "bulk_gate_up_mxfp8 bulk_down_mxfp8 ")
        << tokens;
  }
  PlanOverrides never, from2;
  never.mx_groups_tokens = 0;
  from2.mx_groups_tokens = 2;
  EXPECT_EQ(
      kernel_names(mx_plan("gpt-oss-120b", 128, ExpertFormat::Mxfp4, FuseShared::Auto, never)),
      "bulk_gate_up_mxfp4 bulk_down_mxfp4 ");
  EXPECT_EQ(kernel_names(mx_plan("gpt-oss-120b", 2, ExpertFormat::Mxfp4, FuseShared::Auto, from2)),
            "bulk_gate_up_mxfp4_groups bulk_down_mxfp4_groups ");
  EXPECT_EQ(kernel_names(mx_plan("gpt-oss-120b", 1, ExpertFormat::Mxfp4, FuseShared::Auto, from2)),
            "bulk_gate_up_mxfp4_self_route bulk_down_mxfp4 ");
  // (from one token: the self-routing gate/up kernel has no groups; the down kernel takes them)
  PlanOverrides from1;
  from1.mx_groups_tokens = 1;
  EXPECT_EQ(kernel_names(mx_plan("gpt-oss-120b", 1, ExpertFormat::Mxfp4, FuseShared::Auto, from1)),
            "bulk_gate_up_mxfp4_self_route bulk_down_mxfp4_groups ");
  EXPECT_FALSE(experts_mx_consumer_groups(ExpertFormat::Mxfp8, 128, kMxGroupsTokens));
  EXPECT_FALSE(experts_mx_consumer_groups(ExpertFormat::Bf16, 128, kMxGroupsTokens));
}

// From the prefill rule on, the prefill path: both GEMMs in runs of experts widened to bf16
// (as many as kMxWidenBytes of gate/up matrices hold), the shared expert a fused group.
TEST(PlanMx, PrefillBatchesRunThePackedGemmThenWidenRunsOfExperts) {
  // up to 128 routed tokens per expert the packed GEMM: no run widened, its tile by the rows
  for (const auto [tokens, tile] :
       {std::pair{768, 64}, std::pair{2048, 128}, std::pair{4096, 128}}) {
    for (const auto& [model, f] : {std::pair{"gpt-oss-120b", ExpertFormat::Mxfp4},
                                   std::pair{"minimax-m3", ExpertFormat::Mxfp8}}) {
      const LayerPlan p = mx_plan(model, tokens, f);
      EXPECT_EQ(p.stream, Stream::Grouped) << model << " " << tokens;
      EXPECT_EQ(p.grouped_mx_tile, tile) << model << " " << tokens;
      EXPECT_EQ(p.grouped_mx_chunk, 0) << model << " " << tokens;
      EXPECT_EQ(p.grouped_mx_runs, 0) << model << " " << tokens;
      EXPECT_NE(describe(p).find("GEMMs on the packed bytes, tiles of " + std::to_string(tile)),
                std::string::npos)
          << describe(p);
      EXPECT_NE(to_json(p).find("\"grouped_mx_tile\":" + std::to_string(tile)), std::string::npos)
          << to_json(p);
    }
    // router, routing; plan (2), permute, activation, combine; the two GEMMs
    EXPECT_EQ(own_launches(mx_plan("gpt-oss-120b", tokens, ExpertFormat::Mxfp4)), 2 + 5 + 2);
  }
  for (int tokens : {4097, 16384}) {
    const LayerPlan gpt = mx_plan("gpt-oss-120b", tokens, ExpertFormat::Mxfp4);
    EXPECT_EQ(gpt.stream, Stream::Grouped) << tokens;
    // gate/up [5760, 2880] in bf16: 33 MB, so 16 experts in 512 MiB, 8 runs of 128
    EXPECT_EQ(gpt.grouped_mx_tile, 0) << tokens;
    EXPECT_EQ(gpt.grouped_mx_chunk, 16) << tokens;
    EXPECT_EQ(gpt.grouped_mx_runs, 8) << tokens;
    EXPECT_TRUE(gpt.experts.empty());
    // router, routing; plan (2), permute, activation, combine; 4 per run
    EXPECT_EQ(own_launches(gpt), 2 + 5 + 4 * 8) << tokens;
    const LayerPlan m3 = mx_plan("minimax-m3", tokens, ExpertFormat::Mxfp8);
    EXPECT_EQ(m3.stream, Stream::Grouped) << tokens;
    EXPECT_TRUE(m3.fused) << tokens;
    EXPECT_FALSE(m3.dense_shared);
    // [6144, 6144] in bf16: 75.5 MB, so 7 experts in 512 MiB, 19 runs of 128 + 1 shared
    EXPECT_EQ(m3.grouped_mx_chunk, 7) << tokens;
    EXPECT_EQ(m3.grouped_mx_runs, 19) << tokens;
  }
  PlanOverrides o;
  o.grouped_mx_tile = 0;
  o.grouped_mx_chunk = 5;
  const LayerPlan p = mx_plan("minimax-m3", 1024, ExpertFormat::Mxfp8, FuseShared::Auto, o);
  EXPECT_EQ(p.grouped_mx_chunk, 5);
  EXPECT_EQ(p.grouped_mx_runs, 26);  // 129 rows
  EXPECT_NE(describe(p).find("widen    mxfp8 experts to bf16, 5 at a time (26 runs"),
            std::string::npos)
      << describe(p);
  EXPECT_NE(to_json(p).find("\"grouped_mx_chunk\":5"), std::string::npos) << to_json(p);
  o.grouped_mx_chunk = 1000;
  EXPECT_EQ(mx_plan("minimax-m3", 1024, ExpertFormat::Mxfp8, FuseShared::Auto, o).grouped_mx_chunk,
            129);  // (at most the rows)
  PlanOverrides bulk;
  bulk.stream = Stream::Bulk;
  const LayerPlan forced =
      mx_plan("gpt-oss-120b", 4096, ExpertFormat::Mxfp4, FuseShared::Auto, bulk);
  EXPECT_EQ(kernel_names(forced), "bulk_gate_up_mxfp4_groups bulk_down_mxfp4_groups ");
  EXPECT_EQ(forced.grouped_mx_chunk, 0);
  PlanOverrides grouped;
  grouped.stream = Stream::Grouped;
  EXPECT_EQ(mx_plan("gpt-oss-120b", 1, ExpertFormat::Mxfp4, FuseShared::Auto, grouped).stream,
            Stream::Grouped);
  EXPECT_EQ(mx_plan("gpt-oss-120b", 767, ExpertFormat::Mxfp4).grouped_mx_chunk, 0);
  PlanOverrides from;
  from.grouped_from_tokens = 100;
  EXPECT_EQ(mx_plan("gpt-oss-120b", 100, ExpertFormat::Mxfp4, FuseShared::Auto, from).stream,
            Stream::Grouped);
  EXPECT_EQ(mx_plan("gpt-oss-120b", 99, ExpertFormat::Mxfp4, FuseShared::Auto, from).stream,
            Stream::Bulk);
}

TEST(PlanMx, WhatTheMxInstancesCannotRunIsAnError) {
  PlanOverrides regs;
  regs.stream = Stream::Registers;
  test::expect_error(
      [&] { mx_plan("gpt-oss-120b", 512, ExpertFormat::Mxfp4, FuseShared::Auto, regs); },
      {"MX experts run on the bulk kernels or the prefill path, not the regs kernels"});
  test::expect_error(
      [&] { mx_plan("minimax-m3", 8, ExpertFormat::Mxfp8, FuseShared::Off); },
      {"mxfp8 experts of", "run the shared expert fused", "fusion off was asked for"});
  test::expect_error(
      [&] {
        plan_layer(load_spec("minimax-m3"), 8, FuseShared::Auto, {}, device_profile("sm90"),
                   DType::F8_E4M3, ExpertFormat::Mxfp8);
      },
      {"MX experts are Mxfp8 or Mxfp4 with experts BF16, got mxfp8 with F8_E4M3"});
  test::expect_error(
      [&] {
        plan_layer(load_spec("minimax-m3"), 8, FuseShared::Auto, {}, device_profile("sm90"),
                   DType::BF16, ExpertFormat::Fp8Block);
      },
      {"got fp8 with BF16"});
}

// select_expert_kernel: the MX ring and the format decide, the other options do not apply.
TEST(PlanMx, SelectExpertKernelTakesTheFormatsInstance) {
  auto name = [](const KernelChoice& c) {
    return std::string(expert_kernels()[select_expert_kernel(c)].name);
  };
  EXPECT_EQ(name({.gemm = Gemm::GateUp, .k = 2880, .mx = ExpertFormat::Mxfp4}),
            "bulk_gate_up_mxfp4");
  EXPECT_EQ(name({.gemm = Gemm::Down,
                  .k = 3072,
                  .l2_keep = true,
                  .down_tail = true,
                  .mx = ExpertFormat::Mxfp8}),
            "bulk_down_mxfp8");
  ExpertKernel k = expert_kernels()[find_expert_kernel([] {
    ExpertKernel f;
    f.gemm = Gemm::Down;
    f.ring = Ring::MxWeightsOnly;
    f.mx = ExpertFormat::Mxfp4;
    return f;
  }())];
  EXPECT_EQ(std::string(k.name), "bulk_down_mxfp4");
  k.down_tail = true;
  EXPECT_FALSE(legal(k));  // (no MX tail instance)
  k.down_tail = false;
  k.ring = Ring::WeightsOnly;
  EXPECT_FALSE(legal(k));  // (MX only on its ring)
}

}  // namespace
}  // namespace moekit::plan
