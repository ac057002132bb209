// The layer plan's rules for the decode and bulk kernels (src/plan/expert_rules.h), host-only:
// each rule at the shapes it was measured on (docs/decisions/<rule>.md holds the A/B behind each
// threshold), and each setting (PlanOverrides: -1 takes the rule) forcing it on and off. The
// prefill path's rules: test_plan_grouped.cpp.
#include <gtest/gtest.h>

#include "expect_error.h"
#include "moekit/error.h"
#include "moekit/plan.h"
#include "moekit/spec.h"
#include "plan/expert_kernels.h"
#include "plan/expert_rules.h"

namespace moekit::plan {
namespace {

// docs/decisions/experts_stream_default.md
TEST(PlanRules, StreamIsBulkUpTo256TokensThenRegistersByHiddenSize) {
  for (int hidden : {2048, 2880, 7168}) {
    for (bool tasks_of_16 : {false, true}) {
      for (int tokens : {1, 128, 256}) {
        EXPECT_EQ(experts_stream_default(hidden, tokens, tasks_of_16), Stream::Bulk)
            << "hidden " << hidden << " T=" << tokens;
      }
    }
  }
  EXPECT_EQ(experts_stream_default(7168, 257, true), Stream::RegistersEarlyActs);
  EXPECT_EQ(experts_stream_default(4096, 1024, true), Stream::RegistersEarlyActs);
  EXPECT_EQ(experts_stream_default(2048, 257, true), Stream::Bulk);  // tasks of 16 beat regs
  EXPECT_EQ(experts_stream_default(3584, 1024, true), Stream::Bulk);
  EXPECT_EQ(experts_stream_default(2048, 257, false), Stream::Registers);
}

TEST(PlanRules, ChunkIs8UpTo256TokensElse16) {
  EXPECT_EQ(experts_chunk(1), 8);
  EXPECT_EQ(experts_chunk(256), 8);
  EXPECT_EQ(experts_chunk(257), 16);
}

// docs/decisions/experts_down_split_rows.md
TEST(PlanRules, DownRowsInTwoCopiesOnlyUpToTheLimitAndFor4KBRows) {
  EXPECT_EQ(experts_down_copy_pieces(1, 2048, 8), 2);  // DeepSeek-V3, Kimi-K2
  EXPECT_EQ(experts_down_copy_pieces(8, 2048, 8), 2);
  EXPECT_EQ(experts_down_copy_pieces(9, 2048, 8), 1);  // more tokens than the limit
  EXPECT_EQ(experts_down_copy_pieces(1, 2048, 0), 1);  // turned off
  EXPECT_EQ(experts_down_copy_pieces(1, 768, 8), 1);   // Qwen3-30B-A3B: 1.5 KB rows
  EXPECT_EQ(experts_down_copy_pieces(1, 1024, 8), 1);  // 2 KB rows: the deep ring
  EXPECT_EQ(experts_down_copy_pieces(1, 1536, 8), 1);  // MiniMax-M2, GLM-4.5: 3 KB rows
  EXPECT_EQ(experts_down_copy_pieces(1, 2880, 8), 1);  // gpt-oss: 5.6 KB rows lost
  EXPECT_EQ(experts_down_copy_pieces(1, 2560, 8), 1);  // Qwen2-57B: 5 KB rows lost
}

// docs/decisions/experts_down_deep_ring.md
TEST(PlanRules, DownDeepRingOnlyUpToTheLimitAndFor2KBRows) {
  EXPECT_TRUE(experts_down_deep_ring(1, 768, 8));    // Qwen3-30B-A3B: 1.5 KB rows
  EXPECT_TRUE(experts_down_deep_ring(8, 1024, 8));   // 2 KB rows
  EXPECT_FALSE(experts_down_deep_ring(9, 768, 8));   // more tokens than the limit
  EXPECT_FALSE(experts_down_deep_ring(1, 768, 0));   // turned off
  EXPECT_FALSE(experts_down_deep_ring(1, 1536, 8));  // 3 KB rows: the standard ring
  EXPECT_FALSE(experts_down_deep_ring(1, 2048, 8));  // DeepSeek-V3: split copies instead
}

// docs/decisions/experts_one_token_rings.md
TEST(PlanRules, OneTokenRingsOnlyAtOneTokenAndForTheRowsMeasured) {
  EXPECT_TRUE(experts_down_one_token_ring(1, 768, 1));    // Qwen3-30B-A3B
  EXPECT_FALSE(experts_down_one_token_ring(2, 768, 1));   // two tokens: the deep ring
  EXPECT_FALSE(experts_down_one_token_ring(1, 1024, 1));  // 2 KB rows: the deep ring
  EXPECT_FALSE(experts_down_one_token_ring(1, 768, 0));   // turned off
  EXPECT_TRUE(experts_gate_up_one_token_ring(1, 7168, false, 1));   // DeepSeek-V3
  EXPECT_TRUE(experts_gate_up_one_token_ring(1, 2880, true, 1));    // gpt-oss, self-routed
  EXPECT_TRUE(experts_gate_up_one_token_ring(1, 2048, true, 1));    // Qwen3-30B-A3B
  EXPECT_FALSE(experts_gate_up_one_token_ring(1, 2048, false, 1));  // DeepSeek-V2-Lite
  EXPECT_FALSE(experts_gate_up_one_token_ring(2, 7168, false, 1));  // two tokens
  EXPECT_FALSE(experts_gate_up_one_token_ring(1, 7168, false, 0));  // turned off
  EXPECT_TRUE(experts_down_wide_one_token_ring(1, 2048, 1));   // DeepSeek-V3: 4 KB rows
  EXPECT_FALSE(experts_down_wide_one_token_ring(2, 2048, 1));  // two tokens: split copies
  EXPECT_FALSE(experts_down_wide_one_token_ring(1, 1536, 1));  // 3 KB rows: unmeasured
  EXPECT_FALSE(experts_down_wide_one_token_ring(1, 2880, 1));  // gpt-oss: two chunks a row
  EXPECT_FALSE(experts_down_wide_one_token_ring(1, 2048, 0));  // turned off
}

// docs/decisions/fp8_experts.md (rule 9): fp8 down rows of <= 2 KB (k e4m3 bytes), unless off
TEST(PlanRules, Fp8DownRowsOfAtMost2KBTakeTheDeepRingOfWeightsOnly) {
  EXPECT_TRUE(experts_down_deep_fp8_ring(2048, kDownDeepTokens));  // DeepSeek-V3, Kimi-K2
  EXPECT_TRUE(experts_down_deep_fp8_ring(1536, kDownDeepTokens));  // MiniMax-M2
  EXPECT_FALSE(experts_down_deep_fp8_ring(2176, kDownDeepTokens));
  EXPECT_FALSE(experts_down_deep_fp8_ring(2048, 0));  // MOEKIT_EXPERTS_DOWN_DEEP=0
  // in the plan: MiniMax-M2 in fp8 at two tokens (one token takes the fp8 one-token ring;
  // DeepSeek-V3's down kernel has its tail there), and the deep ring only in fp8
  const MoeSpec ds = load_spec("minimax-m2");
  const DeviceInfo sm90 = device_profile("sm90");
  auto down = [&](DType dt, PlanOverrides o, int tokens) {
    const LayerPlan p = plan_layer(ds, tokens, FuseShared::Auto, o, sm90, dt);
    return std::string(expert_kernels()[p.experts.back().kernel].name);
  };
  EXPECT_EQ(down(DType::F8_E4M3, {}, 2), "bulk_down_weights_only_deep_fp8");
  PlanOverrides off;
  off.down_deep_tokens = 0;
  EXPECT_EQ(down(DType::F8_E4M3, off, 2), "bulk_down_weights_only_fp8");
  EXPECT_EQ(down(DType::BF16, {}, 1).find("deep"), std::string::npos);
  EXPECT_EQ(down(DType::BF16, {}, 2).find("deep"), std::string::npos);
}

// docs/decisions/fp8_experts.md
TEST(PlanRules, Fp8AtOneTokenTakesTheRingsThatCarryTheActivationAndTheScales) {
  EXPECT_TRUE(experts_fp8_one_token_ring(Gemm::GateUp, 1, 7168, 1));  // DeepSeek-V3, Kimi-K2
  EXPECT_TRUE(experts_fp8_one_token_ring(Gemm::GateUp, 1, 3072, 1));  // MiniMax-M2
  EXPECT_TRUE(experts_fp8_one_token_ring(Gemm::Down, 1, 2048, 1));
  EXPECT_TRUE(experts_fp8_one_token_ring(Gemm::Down, 1, 1536, 1));
  EXPECT_FALSE(experts_fp8_one_token_ring(Gemm::Down, 1, 2560, 1));    // rows over 2 KB
  EXPECT_FALSE(experts_fp8_one_token_ring(Gemm::GateUp, 1, 1408, 1));  // scale runs not 16 B
  EXPECT_FALSE(experts_fp8_one_token_ring(Gemm::GateUp, 2, 7168, 1));
  EXPECT_FALSE(experts_fp8_one_token_ring(Gemm::GateUp, 1, 7168, 0));  // ONE_TOKEN_RING=0
  const DeviceInfo sm90 = device_profile("sm90");
  auto names = [&](const char* model, int tokens, PlanOverrides o) {
    const LayerPlan p =
        plan_layer(load_spec(model), tokens, FuseShared::Auto, o, sm90, DType::F8_E4M3);
    std::string s;
    for (const ExpertLaunch& l : p.experts) s += std::string(expert_kernels()[l.kernel].name) + " ";
    return s;
  };
  for (const char* m : {"deepseek-v3", "kimi-k2", "minimax-m2", "deepseek-v4-flash"}) {
    // (E <= 256, the shared expert fused or none: the gate/up kernel routes its token; Kimi-K2's
    // 384 experts are more than 8 a lane)
    const std::string gate_up = std::string(m) != "kimi-k2"
                                    ? "bulk_gate_up_one_token_fp8_self_route "
                                    : "bulk_gate_up_one_token_fp8 ";
    EXPECT_EQ(names(m, 1, {}), gate_up + "bulk_down_one_token_deep_fp8 ") << m;
    EXPECT_EQ(names(m, 2, {}).find("one_token"), std::string::npos) << m;
  }
  PlanOverrides no_self_route;
  no_self_route.self_route_tokens = 0;
  EXPECT_EQ(names("minimax-m2", 1, no_self_route),
            "bulk_gate_up_one_token_fp8 bulk_down_one_token_deep_fp8 ");
  MoeSpec wide = load_spec("minimax-m2");
  wide.num_experts = 384;  // (more than 8 experts a lane: the routing kernel routes)
  EXPECT_TRUE(plan_layer(wide, 1, FuseShared::Auto, {}, sm90, DType::F8_E4M3).routing_kernel);
  EXPECT_FALSE(plan_layer(load_spec("minimax-m2"), 1, FuseShared::Auto, {}, sm90, DType::F8_E4M3)
                   .routing_kernel);
  EXPECT_TRUE(plan_layer(load_spec("kimi-k2"), 1, FuseShared::Auto, {}, sm90, DType::F8_E4M3)
                  .routing_kernel);
  for (const char* m : {"deepseek-v3", "glm-4.5", "deepseek-v4-flash"}) {
    const LayerPlan p = plan_layer(load_spec(m), 1, FuseShared::Auto, {}, sm90, DType::F8_E4M3);
    EXPECT_TRUE(p.fused) << m;  // (fp8: the shared expert always fused)
    EXPECT_FALSE(p.routing_kernel) << m;
    EXPECT_EQ(p.experts.front().early_shared, load_spec(m).shared_slots()) << m;
  }
  PlanOverrides off;
  off.one_token_rings = 0;
  EXPECT_EQ(names("deepseek-v3", 1, off),
            "bulk_gate_up_weights_only_fp8 bulk_down_weights_only_deep_fp8 ");
  // select_expert_kernel: each ring for its GEMM only, chunk 8 only, the tail in its place
  auto name = [](const KernelChoice& c) {
    return std::string(expert_kernels()[select_expert_kernel(c)].name);
  };
  EXPECT_EQ(name({.gemm = Gemm::GateUp, .ring = Ring::Fp8OneToken, .fp8 = true}),
            "bulk_gate_up_one_token_fp8");
  EXPECT_EQ(name({.gemm = Gemm::Down, .ring = Ring::Fp8OneTokenDeep, .fp8 = true}),
            "bulk_down_one_token_deep_fp8");
  EXPECT_EQ(name({.gemm = Gemm::Down, .ring = Ring::Fp8OneToken, .fp8 = true}),
            "bulk_down_weights_only_fp8");
  EXPECT_EQ(name({.gemm = Gemm::GateUp, .chunk = 16, .ring = Ring::Fp8OneToken, .fp8 = true}),
            "bulk_gate_up_16_weights_only_fp8");
  EXPECT_EQ(name({.gemm = Gemm::Down,
                  .ring = Ring::Fp8OneTokenDeep,
                  .down_tail = true,
                  .fp8 = true}),
            "bulk_down_weights_only_tail_fp8");
}

// docs/decisions/experts_l2_acts_ring.md
TEST(PlanRules, WeightsOnlyRingFromTwoTokensWhileTasksAreShort) {
  // the default (-1): tokens x top_k <= 2 x experts, or <= 3 x experts up to 48 tokens
  EXPECT_TRUE(experts_l2_acts_ring(2, 8, 2048, 8, 256, -1));  // DeepSeek-V3: 4 KB down rows
  EXPECT_TRUE(experts_l2_acts_ring(48, 8, 2048, 8, 256, -1));
  EXPECT_TRUE(experts_l2_acts_ring(64, 8, 2048, 8, 256, -1));    // 2 tokens per expert
  EXPECT_FALSE(experts_l2_acts_ring(65, 8, 2048, 8, 256, -1));   // more, above 48 tokens
  EXPECT_FALSE(experts_l2_acts_ring(128, 8, 2048, 8, 256, -1));
  EXPECT_TRUE(experts_l2_acts_ring(96, 8, 2048, 8, 384, -1));    // Kimi-K2: 2 per expert
  EXPECT_FALSE(experts_l2_acts_ring(128, 8, 2048, 8, 384, -1));
  EXPECT_TRUE(experts_l2_acts_ring(2, 8, 1536, 8, 160, -1));    // GLM-4.5: 3 KB
  EXPECT_TRUE(experts_l2_acts_ring(48, 8, 1536, 8, 160, -1));   // 2.4 per expert
  EXPECT_FALSE(experts_l2_acts_ring(49, 8, 1536, 8, 160, -1));  // ... above 48 tokens
  EXPECT_TRUE(experts_l2_acts_ring(48, 8, 768, 8, 128, -1));    // Qwen3-30B-A3B: 3
  EXPECT_FALSE(experts_l2_acts_ring(49, 8, 768, 8, 128, -1));
  EXPECT_TRUE(experts_l2_acts_ring(8, 8, 768, 8, 128, -1));     // 1.5 KB rows from 8 tokens
  EXPECT_FALSE(experts_l2_acts_ring(4, 8, 768, 8, 128, -1));    // ... below: its deep ring
  EXPECT_FALSE(experts_l2_acts_ring(2, 8, 1024, 8, 128, -1));   // (2 KB rows likewise)
  EXPECT_TRUE(experts_l2_acts_ring(2, 8, 14336, 2, 8, -1));     // Mixtral: 28 KB rows
  EXPECT_TRUE(experts_l2_acts_ring(8, 8, 14336, 2, 8, -1));     // 2 per expert
  EXPECT_FALSE(experts_l2_acts_ring(13, 8, 14336, 2, 8, -1));   // more than 3 per expert
  EXPECT_TRUE(experts_l2_acts_ring(64, 8, 2880, 4, 128, -1));   // gpt-oss: 5.6 KB rows
  EXPECT_FALSE(experts_l2_acts_ring(1, 8, 2048, 8, 256, -1));   // one token: its own rings
  EXPECT_FALSE(experts_l2_acts_ring(8, 16, 2048, 8, 256, -1));  // chunk 16: no instance
  // weights_only_tokens = N: up to N tokens whatever the experts (the rows' exception stays)
  EXPECT_TRUE(experts_l2_acts_ring(128, 8, 2048, 8, 256, 128));
  EXPECT_FALSE(experts_l2_acts_ring(33, 8, 2048, 8, 256, 32));
  EXPECT_FALSE(experts_l2_acts_ring(8, 8, 2048, 8, 256, 0));  // turned off
  EXPECT_FALSE(experts_l2_acts_ring(4, 8, 768, 8, 128, 128));
}

// docs/decisions/experts_task16_ring.md
TEST(PlanRules, TasksOf16TokensFrom8RoutedTokensPerExpertUnlessForced) {
  // the default (-1): from 8 routed tokens per expert on average
  EXPECT_TRUE(experts_task16_ring(64, 8, 64, -1));  // Qwen2-57B-A14B
  EXPECT_FALSE(experts_task16_ring(63, 8, 64, -1));
  EXPECT_TRUE(experts_task16_ring(32, 2, 8, -1));      // Mixtral-8x7B
  EXPECT_TRUE(experts_task16_ring(128, 8, 128, -1));   // Qwen3-30B-A3B
  EXPECT_FALSE(experts_task16_ring(96, 8, 128, -1));   // 6 per expert
  EXPECT_TRUE(experts_task16_ring(256, 8, 256, -1));   // DeepSeek-V3
  EXPECT_FALSE(experts_task16_ring(192, 8, 256, -1));  // 6 per expert
  EXPECT_FALSE(experts_task16_ring(256, 8, 384, -1));  // Kimi-K2: 5.3 per expert
  // task16_from = N: from N routed tokens per expert on average
  EXPECT_TRUE(experts_task16_ring(16, 8, 64, 2));   // Qwen2-57B-A14B: 2 per expert
  EXPECT_FALSE(experts_task16_ring(15, 8, 64, 2));  // 1.9
  EXPECT_TRUE(experts_task16_ring(32, 8, 256, 1));  // DeepSeek-V3: 1 per expert
  EXPECT_FALSE(experts_task16_ring(31, 8, 256, 1));
  EXPECT_FALSE(experts_task16_ring(8, 2, 8, 1));    // 8 tokens fill one task of 8
  EXPECT_TRUE(experts_task16_ring(1024, 2, 8, 1));  // (where the bulk kernels run)
  EXPECT_FALSE(experts_task16_ring(128, 2, 8, 0));  // turned off
}

// docs/decisions/experts_l2_keep.md
TEST(PlanRules, L2KeepFrom32TokensForWideHiddenOnlyUnlessForced) {
  EXPECT_TRUE(experts_l2_keep(128, 7168, 8, -1));    // DeepSeek-V3, Kimi-K2
  EXPECT_TRUE(experts_l2_keep(32, 5120, 8, -1));     // GLM-4.5
  EXPECT_FALSE(experts_l2_keep(31, 7168, 8, -1));    // too few tokens
  EXPECT_FALSE(experts_l2_keep(128, 4096, 8, -1));   // Qwen3-235B-A22B: lost at 256
  EXPECT_FALSE(experts_l2_keep(256, 2048, 8, -1));   // Qwen3-30B-A3B: lost at 256
  EXPECT_FALSE(experts_l2_keep(512, 7168, 16, -1));  // chunk 16: not measured
  EXPECT_TRUE(experts_l2_keep(1, 256, 8, 1));        // forced from 1 token, any hidden
  EXPECT_FALSE(experts_l2_keep(128, 7168, 8, 0));    // forced off
  EXPECT_FALSE(experts_l2_keep(512, 7168, 16, 1));   // chunk 16 even when forced
}

// docs/decisions/experts_down_tail.md
TEST(PlanRules, DownTailFrom2To128TokensForHidden7168UnlessForced) {
  EXPECT_EQ(experts_down_tail(2, 7168, 8, -1), 20);  // DeepSeek-V3, Kimi-K2
  EXPECT_EQ(experts_down_tail(64, 7168, 8, -1), 20);
  EXPECT_EQ(experts_down_tail(128, 7168, 8, -1), 20);
  EXPECT_EQ(experts_down_tail(1, 7168, 8, -1), 0);     // slower at one token
  EXPECT_EQ(experts_down_tail(129, 7168, 8, -1), 0);   // equal at 192, worse at 256
  EXPECT_EQ(experts_down_tail(32, 5120, 8, -1), 0);    // GLM-4.5
  EXPECT_EQ(experts_down_tail(32, 2048, 8, -1), 0);    // Qwen3-30B-A3B
  EXPECT_EQ(experts_down_tail(32, 2048, 8, 35), 35);   // forced, any hidden
  EXPECT_EQ(experts_down_tail(300, 7168, 8, 20), 20);
  EXPECT_EQ(experts_down_tail(1, 7168, 8, 20), 20);    // forced: at one token too
  EXPECT_EQ(experts_down_tail(32, 7168, 8, 0), 0);     // forced off
  EXPECT_EQ(experts_down_tail(512, 7168, 16, 20), 0);  // chunk 16: no instance
}

// docs/decisions/experts_gate_up_half_items.md
TEST(PlanRules, HalfItemsUpTo8TokensForHidden7168UnlessForced) {
  EXPECT_EQ(experts_gate_up_half_items(2, 7168, 8, -1, 1), 1);  // DeepSeek-V3, Kimi-K2
  EXPECT_EQ(experts_gate_up_half_items(1, 7168, 8, -1, 1), 0);  // the one-token ring's
  EXPECT_EQ(experts_gate_up_half_items(1, 7168, 8, -1, 0), 1);  // ... turned off
  EXPECT_EQ(experts_gate_up_half_items(8, 7168, 8, -1, 1), 1);
  EXPECT_EQ(experts_gate_up_half_items(16, 7168, 8, -1, 1), 0);  // equal at 16
  EXPECT_EQ(experts_gate_up_half_items(1, 2048, 8, -1, 1), 0);   // Qwen3-30B-A3B: lost
  EXPECT_EQ(experts_gate_up_half_items(1, 6144, 8, -1, 1), 0);   // not measured
  EXPECT_EQ(experts_gate_up_half_items(1, 2048, 8, 2, 1), 2);    // forced, any hidden
  EXPECT_EQ(experts_gate_up_half_items(1, 7168, 8, 0, 1), 0);    // forced off
  EXPECT_EQ(experts_gate_up_half_items(1, 7168, 16, 1, 1), 0);   // chunk 16: no instance
}

// docs/decisions/fuse_shared_auto.md: the dense shared MLP once the fused slots' tasks of 8
// tokens (16 above 256) read its weights again 100 MB or more.
TEST(PlanRules, SharedDenseOverFusedByTheBytesReadAgain) {
  constexpr long long kDeepSeekV3 = 3LL * 2048 * 7168 * 2;       // 88 MB
  constexpr long long kGlm45 = 3LL * 1536 * 5120 * 2;            // 47 MB
  constexpr long long kDeepSeekV4Flash = 3LL * 2048 * 4096 * 2;  // 50 MB
  constexpr long long kDeepSeekV2Lite = 3LL * 2816 * 2048 * 2;   // 35 MB (two slots)
  constexpr long long kQwen2 = 3LL * 20480 * 3584 * 2;           // 440 MB (eight slots)
  for (int t : {1, 8}) EXPECT_FALSE(experts_shared_dense_over_fused(t, 8, kQwen2)) << t;
  EXPECT_TRUE(experts_shared_dense_over_fused(9, 8, kQwen2));
  for (int t : {9, 16}) EXPECT_FALSE(experts_shared_dense_over_fused(t, 8, kDeepSeekV3)) << t;
  for (int t : {17, 24, 32, 128, 256}) {
    EXPECT_TRUE(experts_shared_dense_over_fused(t, 8, kDeepSeekV3)) << t;
  }
  EXPECT_FALSE(experts_shared_dense_over_fused(24, 8, kGlm45));
  EXPECT_TRUE(experts_shared_dense_over_fused(32, 8, kGlm45));
  EXPECT_FALSE(experts_shared_dense_over_fused(16, 8, kDeepSeekV4Flash));
  EXPECT_TRUE(experts_shared_dense_over_fused(24, 8, kDeepSeekV4Flash));
  EXPECT_FALSE(experts_shared_dense_over_fused(24, 8, kDeepSeekV2Lite));
  EXPECT_TRUE(experts_shared_dense_over_fused(32, 8, kDeepSeekV2Lite));
  // tasks of 16 tokens: 17-32 tokens stream the weights twice, 33-48 three times
  EXPECT_FALSE(experts_shared_dense_over_fused(16, 16, kDeepSeekV4Flash));
  EXPECT_FALSE(experts_shared_dense_over_fused(32, 16, kDeepSeekV4Flash));
  EXPECT_TRUE(experts_shared_dense_over_fused(33, 16, kDeepSeekV4Flash));
}

// docs/decisions/experts_down_whole_tiles.md
TEST(PlanRules, DownGridTakesWholeTilesOnlyWithFewIdleSMs) {
  // Qwen3-30B-A3B's 2048 rows = 128 tiles on the H200's 132 resident CTAs: whole tiles
  EXPECT_EQ(experts_down_grid(132, 2048, 1, 4), 128);
  EXPECT_EQ(experts_down_grid(132, 2048, 4, 4), 128);
  EXPECT_EQ(experts_down_grid(132, 2048, 5, 4), 132);  // more tokens than the limit
  EXPECT_EQ(experts_down_grid(132, 2048, 1, 0), 132);  // turned off
  EXPECT_EQ(experts_down_grid(114, 2048, 1, 4), 114);  // more tiles than CTAs
  EXPECT_EQ(experts_down_grid(132, 7168, 1, 4), 132);  // DeepSeek-V3: 448 tiles
  EXPECT_EQ(experts_down_grid(132, 1024, 1, 4), 132);  // half the SMs would idle
  // at most 1/16 of the resident CTAs idle: 124 tiles (8 idle) yes, 123 (9 idle) no
  EXPECT_EQ(experts_down_grid(132, 124 * 16, 1, 4), 124);
  EXPECT_EQ(experts_down_grid(132, 123 * 16, 1, 4), 132);
}

// The precedence of select_expert_kernel: the ring of weights only and the down rings take the
// place of the split copies, the L2 keep and the tail; chunk 16 has only the standard and the
// weights-only rings; the register kernels' unroll and warps by GEMM and chunk.
TEST(PlanRules, SelectExpertKernelNamesThePrecedence) {
  auto name = [](const KernelChoice& c) { return std::string(expert_kernels()[select_expert_kernel(c)].name); };
  EXPECT_EQ(name({.gemm = Gemm::Down, .k = 2048, .split_rows = true}), "bulk_down_split_rows");
  EXPECT_EQ(name({.gemm = Gemm::Down, .k = 2048, .split_rows = true, .down_tail = true}),
            "bulk_down_split_rows_tail");
  // the split copies win over the L2 keep (no split-and-keep instance)
  EXPECT_EQ(name({.gemm = Gemm::Down, .k = 2048, .split_rows = true, .l2_keep = true}),
            "bulk_down_split_rows");
  EXPECT_EQ(name({.gemm = Gemm::Down, .k = 2048, .ring = Ring::WeightsOnly, .split_rows = true,
                  .l2_keep = true, .down_tail = true}),
            "bulk_down_weights_only_l2_keep_tail");
  EXPECT_EQ(name({.gemm = Gemm::Down, .k = 768, .ring = Ring::Deep, .down_tail = true}),
            "bulk_down_deep");
  EXPECT_EQ(name({.gemm = Gemm::GateUp, .k = 7168, .ring = Ring::OneToken, .half_items = true}),
            "bulk_gate_up_one_token_half_items");
  EXPECT_EQ(name({.gemm = Gemm::GateUp, .k = 7168, .ring = Ring::OneToken, .l2_keep = true}),
            "bulk_gate_up_l2_keep");
  EXPECT_EQ(name({.gemm = Gemm::GateUp, .k = 2048, .half_items = true, .self_route = true}),
            "bulk_gate_up_half_items");
  EXPECT_EQ(name({.gemm = Gemm::GateUp, .chunk = 16, .ring = Ring::OneToken}), "bulk_gate_up_16");
  EXPECT_EQ(name({.gemm = Gemm::Down, .chunk = 16, .ring = Ring::WeightsOnly}),
            "bulk_down_16_weights_only");
  EXPECT_EQ(name({.gemm = Gemm::Down, .stream = Stream::Registers, .k = 1024}), "regs_down_4warps");
  EXPECT_EQ(name({.gemm = Gemm::Down, .stream = Stream::Registers, .k = 1088}), "regs_down");
  EXPECT_EQ(name({.gemm = Gemm::Down, .chunk = 16, .stream = Stream::Registers, .k = 768}),
            "regs_down_16");
  EXPECT_EQ(name({.gemm = Gemm::GateUp, .stream = Stream::RegistersEarlyActs, .k = 7168}),
            "regs_early_gate_up");
  EXPECT_THROW(select_expert_kernel({.chunk = 32}), Error);
}

// The table: unique names, every row legal and found by its own fields, and no two rows alike.
TEST(PlanRules, EveryInstanceIsLegalNamedOnceAndFoundByItsFields) {
  const auto kernels = expert_kernels();
  EXPECT_EQ(static_cast<int>(kernels.size()), kNumExpertKernels);
  for (int i = 0; i < static_cast<int>(kernels.size()); ++i) {
    const ExpertKernel& k = kernels[i];
    EXPECT_TRUE(legal(k)) << describe(k);
    EXPECT_EQ(find_expert_kernel(k), i) << describe(k) << ": another row has the same fields";
    for (int j = 0; j < i; ++j) {
      EXPECT_NE(std::string(k.name), std::string(kernels[j].name)) << "rows " << j << " and " << i;
    }
  }
  ExpertKernel none;
  none.gemm = Gemm::GateUp;
  none.down_tail = true;  // no gate/up instance has a down tail
  EXPECT_EQ(find_expert_kernel(none), -1);
}

}  // namespace
}  // namespace moekit::plan
