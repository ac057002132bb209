// The layer plan's rules for the prefill path (src/plan/expert_rules.h), host-only: where the
// grouped GEMMs take over, their padded rows, the tile and instance each dtype and device takes,
// and the shared MLP beside them; each at the shapes it was measured on (docs/decisions/<rule>.md)
// and each setting (PlanOverrides: -1 takes the rule) forcing it on and off.
#include <gtest/gtest.h>

#include "expect_error.h"
#include "moekit/error.h"
#include "moekit/plan.h"
#include "moekit/spec.h"
#include "plan/expert_kernels.h"
#include "plan/expert_rules.h"

namespace moekit::plan {
namespace {

// docs/decisions/experts_grouped_path.md
TEST(PlanRules, GroupedPathFrom64TokensAnd4RoutedTokensPerExpertUnlessForced) {
  EXPECT_FALSE(experts_grouped_path(64, 8, 256, false, -1));  // DeepSeek-V3: 2 per expert
  EXPECT_FALSE(experts_grouped_path(127, 8, 256, false, -1));
  EXPECT_TRUE(experts_grouped_path(128, 8, 256, false, -1));  // 4 per expert
  EXPECT_TRUE(experts_grouped_path(64, 8, 128, false, -1));   // Qwen3-30B-A3B: 4 per expert
  EXPECT_FALSE(experts_grouped_path(63, 8, 128, false, -1));
  EXPECT_FALSE(experts_grouped_path(32, 2, 8, false, -1));  // Mixtral: 8 per expert, < 64 tokens
  EXPECT_TRUE(experts_grouped_path(64, 2, 8, false, -1));
  EXPECT_TRUE(experts_grouped_path(1, 8, 256, false, 1));       // forced from 1 token
  EXPECT_FALSE(experts_grouped_path(16384, 8, 256, false, 0));  // 0: never
}

// docs/decisions/experts_grouped_path.md: fp8 block-scale experts from 2 routed tokens per expert
TEST(PlanRules, Fp8GroupedPathFrom64TokensAnd2RoutedTokensPerExpert) {
  EXPECT_TRUE(experts_grouped_path(64, 8, 256, true, -1));  // DeepSeek-V3, MiniMax-M2: 2 each
  EXPECT_FALSE(experts_grouped_path(63, 8, 256, true, -1));
  EXPECT_FALSE(experts_grouped_path(95, 8, 384, true, -1));  // Kimi-K2: from 96 tokens
  EXPECT_TRUE(experts_grouped_path(96, 8, 384, true, -1));
  EXPECT_FALSE(experts_grouped_path(32, 8, 64, true, -1));   // 4 per expert, below 64 tokens
  EXPECT_FALSE(experts_grouped_path(128, 8, 256, true, 0));  // 0: never
}

// docs/decisions/mx_experts.md: the MX prefill path from 24 routed tokens per expert; its runs
// of widened experts by the bytes of their bf16 gate/up matrices
TEST(PlanRules, MxGroupedPathFrom24RoutedTokensPerExpertInRunsOfHalfAGibibyte) {
  EXPECT_FALSE(experts_grouped_path_mx(767, 4, 128, -1));  // gpt-oss-120b
  EXPECT_TRUE(experts_grouped_path_mx(768, 4, 128, -1));
  EXPECT_TRUE(experts_grouped_path_mx(48, 8, 16, -1));  // (no floor of 64 tokens)
  EXPECT_TRUE(experts_grouped_path_mx(1, 4, 128, 1));
  EXPECT_FALSE(experts_grouped_path_mx(1 << 20, 4, 128, 0));
  EXPECT_EQ(experts_grouped_mx_chunk(128, 2880, 2880, -1), 16);   // 33 MB each
  EXPECT_EQ(experts_grouped_mx_chunk(129, 6144, 3072, -1), 7);    // 75.5 MB each
  EXPECT_EQ(experts_grouped_mx_chunk(129, 16384, 16384, -1), 1);  // 1 GiB each: one at a time
  EXPECT_EQ(experts_grouped_mx_chunk(5, 64, 64, -1), 5);          // at most the rows
  EXPECT_EQ(experts_grouped_mx_chunk(129, 6144, 3072, 40), 40);
  // the packed GEMM up to 128 routed tokens per expert (gpt-oss-120b: 4096 tokens), tiles of 128
  // from 64 of them; widened above; a setting as it is
  EXPECT_EQ(experts_grouped_mx_tile(768, 4, 128, -1), 64);
  EXPECT_EQ(experts_grouped_mx_tile(2047, 4, 128, -1), 64);
  EXPECT_EQ(experts_grouped_mx_tile(2048, 4, 128, -1), 128);
  EXPECT_EQ(experts_grouped_mx_tile(4096, 4, 128, -1), 128);
  EXPECT_EQ(experts_grouped_mx_tile(4097, 4, 128, -1), 0);
  EXPECT_EQ(experts_grouped_mx_tile(4096, 4, 128, 0), 0);
  EXPECT_EQ(experts_grouped_mx_tile(16384, 4, 128, 64), 64);
  EXPECT_EQ(experts_grouped_mx_tile(768, 4, 128, 128), 128);
  test::expect_error([] { experts_grouped_mx_tile(4096, 4, 128, 96); },
                     {"expected 0, 64 or 128, got 96"});
}

// docs/decisions/experts_grouped_tile.md
TEST(PlanRules, GroupedPaddedRowsBoundTheRealRowsAndShrinkWithTheTile) {
  struct Shape {
    int tokens, top_k, experts, shared;
  };
  for (const Shape s : {Shape{4096, 8, 256, 1}, Shape{1024, 8, 128, 0}, Shape{4096, 2, 8, 0},
                        Shape{16384, 4, 128, 1}, Shape{257, 8, 256, 1}}) {
    const double real = static_cast<double>(s.tokens) * (s.top_k + s.shared);
    for (int tile : {64, 128}) {
      const double rows = experts_grouped_padded_rows(s.tokens, s.top_k, s.experts, s.shared, tile);
      // every expert pads its last tile by less than a tile; the Poisson sum loses < 1e-6
      EXPECT_GE(rows, real * (1 - 1e-6)) << s.tokens << " tokens, tile " << tile;
      EXPECT_LE(rows, real + static_cast<double>(s.experts + s.shared) * tile)
          << s.tokens << " tokens, tile " << tile;
    }
    EXPECT_LE(experts_grouped_padded_rows(s.tokens, s.top_k, s.experts, s.shared, 64),
              experts_grouped_padded_rows(s.tokens, s.top_k, s.experts, s.shared, 128));
  }
  // a shared slot holds every token: 4096 rows are 32 whole tiles of 128 and 64 of 64
  EXPECT_NEAR(experts_grouped_padded_rows(4096, 8, 256, 1, 128) -
                  experts_grouped_padded_rows(4096, 8, 256, 0, 128),
              4096.0, 1e-6);
  // 128 routed rows per expert on average: about half the experts take a second 128-row tile
  const double r128 = experts_grouped_padded_rows(4096, 8, 256, 0, 128) / (4096.0 * 8);
  EXPECT_GT(r128, 1.3);
  EXPECT_LT(r128, 1.7);
}

// docs/decisions/experts_grouped_gemms.md: the faster pair of instances of each measured layer
TEST(PlanRules, GroupedTileIsTheMeasuredFasterOne) {
  struct Point {
    int tokens, top_k, experts, shared;
    bool fp8;
    int tile_m;
  };
  for (const Point p :
       {// bf16: the 64-row ping-pong at 512-4096 tokens on DeepSeek-V3, MiniMax-M3,
        // Qwen3-30B-A3B and Mixtral-8x7B (where neither tile pads), the 128-row cooperative
        // one at 16384
        Point{512, 8, 256, 1, false, 64}, Point{4096, 8, 256, 1, false, 64},
        Point{4096, 4, 128, 1, false, 64}, Point{4096, 8, 128, 0, false, 64},
        Point{2048, 2, 8, 0, false, 64}, Point{4096, 2, 8, 0, false, 64},
        Point{16384, 8, 256, 1, false, 128}, Point{16384, 4, 128, 1, false, 128},
        Point{16384, 8, 128, 0, false, 128}, Point{16384, 2, 8, 0, false, 128},
        // fp8 (DeepSeek-V3, MiniMax-M2: 256 experts, top 8): ping-pong up to 64 routed rows
        // per expert, cooperative from 128
        Point{256, 8, 256, 1, true, 64}, Point{1024, 8, 256, 1, true, 64},
        Point{2048, 8, 256, 1, true, 64}, Point{2048, 8, 256, 0, true, 64},
        Point{4096, 8, 256, 1, true, 128}, Point{4096, 8, 256, 0, true, 128},
        Point{16384, 8, 256, 1, true, 128}}) {
    EXPECT_EQ(experts_grouped_tile_m(p.tokens, p.top_k, p.experts, p.shared, p.fp8, 0), p.tile_m)
        << p.tokens << " tokens, top " << p.top_k << " of " << p.experts << (p.fp8 ? " fp8" : "");
  }
}

// docs/decisions/experts_grouped_gemms.md: on the H100 80GB HBM3 the 128-row cooperative
// instance from 256 routed rows an expert (bf16); below, and on other GPUs, the rule above
TEST(PlanRules, GroupedTileOfTheH100) {
  const DeviceInfo h100 = device_profile("h100");
  EXPECT_EQ(h100.grouped_tile128_from_rows, 256);
  EXPECT_EQ(with_measured_facts(DeviceInfo{"NVIDIA H100 80GB HBM3", 132, tuning::Arch::Sm90})
                .grouped_tile128_from_rows,
            256);
  for (const char* other : {"NVIDIA H200", "NVIDIA H100 PCIe", "sm90"}) {
    EXPECT_EQ(
        with_measured_facts(DeviceInfo{other, 132, tuning::Arch::Sm90}).grouped_tile128_from_rows,
        0)
        << other;
  }
  struct Point {
    int tokens, top_k, experts, shared;
    int tile_m;
  };
  for (const Point p :
       {// Mixtral-8x7B (8, 2): 128 routed rows an expert at 512 tokens, 256 at 1024
        Point{512, 2, 8, 0, 64}, Point{1024, 2, 8, 0, 128}, Point{4096, 2, 8, 0, 128},
        // Qwen3-30B-A3B (128, 8) and Qwen2-57B-A14B (64, 8, 8 shared slots) from 256
        Point{2048, 8, 128, 0, 64}, Point{4096, 8, 128, 0, 128}, Point{2048, 8, 64, 8, 128},
        // MiniMax-M3 (128, 4) and DeepSeek-V3 (256, 8) at 4096: 128 rows; DeepSeek-V3 at
        // 16384: 512
        Point{4096, 4, 128, 1, 64}, Point{4096, 8, 256, 1, 64}, Point{16384, 8, 256, 1, 128}}) {
    EXPECT_EQ(experts_grouped_tile_m(p.tokens, p.top_k, p.experts, p.shared, false,
                                     h100.grouped_tile128_from_rows),
              p.tile_m)
        << p.tokens << " tokens, top " << p.top_k << " of " << p.experts;
  }
  // fp8 keeps its rule
  EXPECT_EQ(experts_grouped_tile_m(2048, 8, 256, 1, true, 256), 64);
  // and the plan reads the device's fact
  const MoeSpec mixtral = load_spec("mixtral-8x7b");
  const auto kernels = grouped_gemm_kernels();
  EXPECT_EQ(kernels[plan_layer(mixtral, 4096, FuseShared::Auto, {}, h100).grouped_gate_up].tile_m,
            128);
  EXPECT_EQ(kernels[plan_layer(mixtral, 4096, FuseShared::Auto, {}, device_profile("sm90"))
                        .grouped_gate_up]
                .tile_m,
            64);
}

TEST(PlanRules, GroupedGemmsAreTheDtypesInstancesOfTheTileOrTheSettings) {
  const auto kernels = grouped_gemm_kernels();
  for (const bool fp8 : {false, true}) {
    for (const int tokens : {512, 4096, 16384}) {
      const GroupedGemms g = experts_grouped_gemms(tokens, 8, 256, 1, fp8, 0, -1, -1);
      ASSERT_GE(g.gate_up, 0);
      EXPECT_EQ(g.gate_up, g.down) << "one instance for both GEMMs";
      EXPECT_EQ(kernels[g.gate_up].fp8, fp8);
      EXPECT_EQ(kernels[g.gate_up].tile_m, experts_grouped_tile_m(tokens, 8, 256, 1, fp8, 0));
    }
  }
  const int bf16_64 = find_grouped_gemm("grouped_bf16_64x256_pingpong");
  const int bf16_128 = find_grouped_gemm("grouped_bf16_128x256_coop");
  const GroupedGemms forced = experts_grouped_gemms(16384, 8, 256, 1, false, 0, bf16_64, bf16_128);
  EXPECT_EQ(forced.gate_up, bf16_64);
  EXPECT_EQ(forced.down, bf16_128);
  const int fp8_64 = find_grouped_gemm("grouped_fp8_64x128_pingpong");
  test::expect_error([&] { experts_grouped_gemms(4096, 8, 256, 1, false, 0, fp8_64, -1); },
                     {"grouped_fp8_64x128_pingpong takes fp8 operands", "holds bf16 experts"});
  test::expect_error([&] { experts_grouped_gemms(4096, 8, 256, 1, true, 0, -1, bf16_64); },
                     {"down grouped GEMM", "takes bf16 operands", "holds fp8 experts"});
}

// docs/decisions/fuse_shared_auto.md: on the grouped path `auto` runs the shared MLP as dense
// GEMMs wherever the dense shared path applies; without it, and for quantised experts, the shared
// slots ride as more groups.
TEST(PlanRules, GroupedPathRunsTheSharedMlpDense) {
  const DeviceInfo sm90 = device_profile("sm90");
  auto plan = [&](const char* model, int tokens, PlanOverrides o, DType dt) {
    return plan_layer(load_spec(model), tokens, FuseShared::Auto, o, sm90, dt);
  };
  for (const char* m : {"deepseek-v3", "minimax-m3", "kimi-k2", "qwen2-57b-a14b"}) {
    for (int tokens : {1024, 4096, 16384}) {
      const LayerPlan p = plan(m, tokens, {}, DType::BF16);
      EXPECT_EQ(p.stream, Stream::Grouped) << m << " " << tokens;
      EXPECT_FALSE(p.fused) << m << " " << tokens;
      EXPECT_TRUE(p.dense_shared) << m << " " << tokens;
    }
  }
  PlanOverrides no_dense;
  no_dense.shared_dense_tokens = 0;
  EXPECT_TRUE(plan("deepseek-v3", 4096, no_dense, DType::BF16).fused);
  const LayerPlan fp8 = plan("deepseek-v3", 4096, {}, DType::F8_E4M3);
  EXPECT_EQ(fp8.stream, Stream::Grouped);
  EXPECT_TRUE(fp8.fused);
}

}  // namespace
}  // namespace moekit::plan
