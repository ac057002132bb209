// Router GEMM tuning on the CPU: legality rules, the candidate generator, the lookup order
// (override -> arch -> generic -> fallback), the tables' rows, the JSON override file and its
// error messages. No GPU needed.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "expect_error.h"
#include "moekit/error.h"
#include "moekit/spec.h"
#include "moekit/tuning.h"
#include "tuning/router_gemm_select.h"

namespace moekit::tuning {
namespace {

constexpr RouterGemmConfig kDot1{RouterGemmBackend::Dot, 256, 1, 1, 1};
constexpr RouterGemmConfig kDot4{RouterGemmBackend::Dot, 128, 2, 4, 1};
constexpr RouterGemmConfig kSplit{RouterGemmBackend::SplitK, 256, 16, 8, 4};
using test::expect_error;

constexpr RouterGemmConfig kCublas{RouterGemmBackend::Cublas, 0, 0, 0, 1};

TEST(RouterGemmTuning, LegalityRules) {
  EXPECT_EQ(router_gemm_config_problem(router_gemm_fallback(), DType::BF16, 100, 3, 1), nullptr);
  EXPECT_EQ(router_gemm_config_problem(kDot1, DType::BF16, 7168, 256, 1), nullptr);
  EXPECT_EQ(router_gemm_config_problem(kDot1, DType::F32, 3072, 256, 1), nullptr);
  EXPECT_EQ(router_gemm_config_problem(kSplit, DType::BF16, 1000, 67, 33), nullptr);
  const std::vector<std::pair<RouterGemmConfig, std::string>> bad = {
      {{RouterGemmBackend::Dot, 512, 1, 1, 1}, "dot: block must be 64, 128 or 256"},
      {{RouterGemmBackend::Dot, 256, 3, 1, 1}, "dot: no compiled kernel"},
      {{RouterGemmBackend::Dot, 256, 1, 1, 3}, "dot: split_k must be 1, 2, 4 or 8"},
      {{RouterGemmBackend::Dot, 256, 1, 1, 16}, "dot: split_k must be 1, 2, 4 or 8"},
      {{RouterGemmBackend::SplitK, 256, 16, 8, 9}, "splitk: split_k must be in 1..8"},
      {{RouterGemmBackend::SplitK, 192, 16, 8, 1}, "splitk: block must be 128 or 256"},
      {{RouterGemmBackend::SplitK, 256, 48, 8, 1}, "splitk: no compiled kernel"},
      {{RouterGemmBackend::Naive, 256, 0, 0, 1}, "take no parameters"},
  };
  for (const auto& [c, why] : bad) {
    const char* p = router_gemm_config_problem(c, DType::BF16, 7168, 256, 1);
    ASSERT_NE(p, nullptr) << describe(c);
    EXPECT_NE(std::string(p).find(why), std::string::npos) << p;
  }
  // shape-dependent rules
  EXPECT_NE(std::string(router_gemm_config_problem(kDot1, DType::BF16, 100, 256, 1)).find(
                "K must be a multiple of 8"),
            std::string::npos);
  EXPECT_NE(std::string(router_gemm_config_problem(kSplit, DType::F32, 3072, 256, 8)).find(
                "weights must be BF16"),
            std::string::npos);
  EXPECT_NE(router_gemm_config_problem(kDot1, DType::F16, 4096, 8, 1), nullptr);
  EXPECT_NE(router_gemm_config_problem(kDot1, DType::BF16, 4096, 8, -1), nullptr);
}

TEST(RouterGemmTuning, CandidatesAreLegalAndIncludeCublas) {
  for (DType dt : {DType::BF16, DType::F32}) {
    for (int k : {7168, 2880, 1000}) {
      for (int n : {256, 67, 8}) {
        for (int m : {1, 2, 3, 8, 17, 64, 128}) {
          const std::vector<RouterGemmConfig> c = router_gemm_candidates(dt, k, n, m);
          ASSERT_FALSE(c.empty());
          bool has_cublas = false;
          for (const RouterGemmConfig& x : c) {
            EXPECT_EQ(router_gemm_config_problem(x, dt, k, n, m), nullptr) << describe(x);
            has_cublas |= x == kCublas;
            if (dt == DType::F32) EXPECT_NE(x.backend, RouterGemmBackend::SplitK);
            EXPECT_NE(x.backend, RouterGemmBackend::Naive) << "naive only when nothing else runs";
          }
          EXPECT_TRUE(has_cublas);
          for (size_t i = 0; i < c.size(); ++i)
            for (size_t j = i + 1; j < c.size(); ++j) EXPECT_FALSE(c[i] == c[j]) << describe(c[i]);
        }
      }
    }
  }
  // K not a multiple of 8: only the kernels without vector loads remain.
  const std::vector<RouterGemmConfig> odd = router_gemm_candidates(DType::BF16, 100, 64, 4);
  ASSERT_EQ(odd.size(), 2u);
  EXPECT_EQ(odd[0], kCublas);
  EXPECT_EQ(odd[1], router_gemm_fallback());
}

TEST(RouterGemmTuning, LookupOrder) {
  const std::vector<RouterGemmRow> overrides = {{DType::BF16, 7168, 256, 1, 2, kCublas}};
  const std::vector<RouterGemmRow> arch = {{DType::BF16, 7168, 256, 1, 4, kDot4},
                                           {DType::BF16, 0, 0, 1, 64, kSplit}};
  const std::vector<RouterGemmRow> generic = {{DType::BF16, 0, 0, 1, 128, kDot1},
                                              {DType::F32, 0, 0, 1, 8, kDot1}};
  auto choose = [&](DType dt, int k, int n, int m) {
    return choose_router_gemm(overrides, arch, generic, dt, k, n, m);
  };
  RouterGemmChoice c = choose(DType::BF16, 7168, 256, 2);
  EXPECT_EQ(c.source, ConfigSource::Override);
  EXPECT_EQ(c.config, kCublas);
  c = choose(DType::BF16, 7168, 256, 3);  // past the override's M range
  EXPECT_EQ(c.source, ConfigSource::ArchTable);
  EXPECT_EQ(c.config, kDot4);
  EXPECT_EQ(c.row, 0);
  c = choose(DType::BF16, 4096, 128, 3);  // arch wildcard row
  EXPECT_EQ(c.source, ConfigSource::ArchTable);
  EXPECT_EQ(c.row, 1);
  c = choose(DType::BF16, 4096, 128, 100);  // past the arch rows
  EXPECT_EQ(c.source, ConfigSource::GenericTable);
  EXPECT_EQ(c.config, kDot1);
  c = choose(DType::BF16, 4096, 128, 200);  // past every row
  EXPECT_EQ(c.source, ConfigSource::Fallback);
  EXPECT_EQ(c.config, router_gemm_fallback());
  // A matching row whose config cannot run the shape is skipped: K % 8 != 0 falls through the
  // vector-load kernels to the fallback.
  c = choose(DType::BF16, 1001, 128, 3);
  EXPECT_EQ(c.source, ConfigSource::Fallback);
  // fp32 weights never take the bf16 split-K wildcard row.
  c = choose(DType::F32, 3072, 256, 5);
  EXPECT_EQ(c.source, ConfigSource::GenericTable);
  EXPECT_EQ(c.config, kDot1);
  // No tables at all: the fallback.
  c = choose_router_gemm({}, {}, {}, DType::BF16, 7168, 256, 1);
  EXPECT_EQ(c.source, ConfigSource::Fallback);
}

TEST(RouterGemmTuning, BuiltinTablesAreValidAndDrawnFromTheCandidates) {
  for (Arch a : {Arch::Generic, Arch::Sm90, Arch::Sm100}) {
    const std::span<const RouterGemmRow> rows = builtin_table(a);
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_NO_THROW(validate_row(rows[i], std::string(arch_name(a)) + " row " + std::to_string(i)));
    }
  }
  ASSERT_FALSE(builtin_table(Arch::Generic).empty());
  // For every model in configs/ and M = 1..128, what the lookup picks is legal and is one of the
  // candidates the tuner times (the heuristic and the tuner share one generator).
  for (const std::string& name : list_model_names()) {
    const MoeSpec spec = load_spec(name);
    for (const RouterGemmShape& s : router_gemm_shapes(spec)) {
      for (Arch a : {Arch::Generic, Arch::Sm90, Arch::Sm100}) {
        for (int m = 1; m <= 128; ++m) {
          const RouterGemmChoice c = choose_router_gemm({}, a, s.weight_dtype, s.k, s.n, m);
          EXPECT_NE(c.source, ConfigSource::Fallback) << name << " M=" << m;
          const std::vector<RouterGemmConfig> cands =
              router_gemm_candidates(s.weight_dtype, s.k, s.n, m);
          EXPECT_NE(std::find(cands.begin(), cands.end(), c.config), cands.end())
              << name << " " << arch_name(a) << " M=" << m << ": " << describe(c.config);
        }
      }
    }
  }
}

TEST(RouterGemmTuning, ShapesComeFromTheSpec) {
  const MoeSpec v3 = load_spec("deepseek-v3");
  const std::vector<RouterGemmShape> s = router_gemm_shapes(v3);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0], (RouterGemmShape{DType::BF16, 7168, 256, false}));
  const MoeSpec oss = load_spec("gpt-oss-120b");
  EXPECT_EQ(router_gemm_shapes(oss)[0], (RouterGemmShape{DType::BF16, 2880, 128, true}));
  const MoeSpec mm = load_spec("minimax-m2");
  EXPECT_EQ(router_gemm_shapes(mm)[0].weight_dtype, DType::F32);
  const MoeSpec qwen2 = load_spec("qwen2-57b-a14b");  // gated shared expert: one more column
  EXPECT_EQ(router_gemm_shapes(qwen2)[0].n, qwen2.num_experts + 1);
}

TEST(RouterGemmTuning, JsonRoundTripAndOverrideFile) {
  const std::string text = R"({"arch": "sm90", "device": "test", "rows": [
    {"dtype": "BF16", "k": 7168, "n": 256, "m_min": 1, "m_max": 3, "backend": "splitk",
     "block": 128, "tile_n": 32, "tile_m": 8, "split_k": 8, "us_mean": 1.5},
    {"dtype": "F32", "k": 3072, "n": 256, "m_min": 1, "m_max": 128, "backend": "cublas"}]})";
  const std::vector<RouterGemmRow> rows = parse_tuning_json(text, "test");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].config, (RouterGemmConfig{RouterGemmBackend::SplitK, 128, 32, 8, 8}));
  EXPECT_EQ(rows[1].config, kCublas);
  EXPECT_EQ(rows[1].weight_dtype, DType::F32);
  const std::string inc = tuning_inc(rows);
  EXPECT_NE(inc.find("MK_ROUTER_GEMM_ROW(BF16, 7168, 256, 1, 3, SplitK, 128, 32, 8, 8)"),
            std::string::npos)
      << inc;

  const std::string path = ::testing::TempDir() + "moekit_tuning_test.json";
  {
    std::ofstream f(path);
    f << text;
  }
  set_tuning_file(path);
  EXPECT_EQ(override_rows().size(), 2u);
  RouterGemmChoice c = choose_router_gemm(Arch::Sm90, DType::BF16, 7168, 256, 2);
  EXPECT_EQ(c.source, ConfigSource::Override);
  EXPECT_EQ(c.config.tile_n, 32);
  c = choose_router_gemm(Arch::Sm90, DType::BF16, 7168, 256, 4);
  EXPECT_NE(c.source, ConfigSource::Override);
  set_tuning_file("");  // none, and the environment no longer applies
  EXPECT_TRUE(override_rows().empty());
  std::remove(path.c_str());
  set_tuning_file(path);
  expect_error([] { override_rows(); }, {"cannot open tuning file", "moekit_tuning_test.json"});
  set_tuning_file("");
}

TEST(RouterGemmTuning, BadTuningFilesNameTheProblem) {
  auto parse = [](const std::string& rows) {
    return [rows] { parse_tuning_json(R"({"rows": [)" + rows + "]}", "bad.json"); };
  };
  const std::string ok = R"("dtype": "BF16", "k": 7168, "n": 256, "m_min": 1, "m_max": 4)";
  expect_error(parse("{" + ok + R"(, "backend": "fast"})"),
               {"bad.json", "row 0", "unknown router GEMM backend 'fast'"});
  expect_error(parse(R"({"dtype": "F32", "k": 3072, "n": 256, "m_min": 1, "m_max": 4,
                         "backend": "splitk", "block": 256, "tile_n": 16, "tile_m": 8})"),
               {"row 0", "splitk: weights must be BF16", "F32"});
  expect_error(parse("{" + ok + R"(, "backend": "dot", "block": 256, "tile_n": 1, "tile_m": 3})"),
               {"row 0", "dot: no compiled kernel", "tile_m=3"});
  expect_error(parse("{" + ok + R"(, "backend": "cublas"}, {"dtype": "BF16", "k": 7168,
                     "n": 256, "m_min": 9, "m_max": 4, "backend": "cublas"})"),
               {"row 1", "m_min <= m_max"});
  expect_error(parse(R"({"dtype": "BF16", "k": 7168, "m_min": 1, "m_max": 4,
                         "backend": "cublas"})"),
               {"row 0", "missing key \"n\""});
  expect_error(parse(R"({"dtype": "BF16", "k": "7168", "n": 256, "m_min": 1, "m_max": 4,
                         "backend": "cublas"})"),
               {"row 0", "\"k\" as an integer"});
  expect_error(parse(R"({"dtype": "Q4", "k": 7168, "n": 256, "m_min": 1, "m_max": 4,
                         "backend": "cublas"})"),
               {"row 0", "Q4"});
  expect_error([] { parse_tuning_json("{\"rows\": 3}", "x.json"); }, {"x.json", "\"rows\" array"});
  expect_error([] { parse_tuning_json("{", "x.json"); }, {"x.json", "not valid JSON"});
  expect_error([] { parse_tuning_json(R"({"arch": "sm75", "rows": []})", "x.json"); },
               {"unknown architecture 'sm75'"});
}

TEST(RouterGemmTuning, ArchFromComputeCapability) {
  EXPECT_EQ(arch_from_compute_capability(9, 0), Arch::Sm90);
  EXPECT_EQ(arch_from_compute_capability(10, 0), Arch::Sm100);
  EXPECT_EQ(arch_from_compute_capability(8, 9), Arch::Generic);
  EXPECT_EQ(parse_arch("sm100"), Arch::Sm100);
  EXPECT_EQ(parse_backend(backend_name(RouterGemmBackend::SplitK)), RouterGemmBackend::SplitK);
}

}  // namespace
}  // namespace moekit::tuning

namespace moekit::tuning {

// ---- the tuner's choice rule (src/tuning/router_gemm_select.h) ----

namespace {

constexpr RouterGemmConfig kDotSplit{RouterGemmBackend::Dot, 128, 1, 1, 4};

RouterGemmSegment segment(int lo, int hi, std::vector<std::vector<RouterGemmTiming>> points) {
  RouterGemmSegment s;
  s.m_min = lo;
  s.m_max = hi;
  s.points = std::move(points);
  return s;
}

}  // namespace

TEST(RouterGemmTuning, SegmentsAndMeasurePoints) {
  const auto segs = router_gemm_segments({16, 1, 2, 3, 3, 8});
  const std::vector<std::pair<int, int>> want = {{1, 1}, {2, 2}, {3, 3}, {4, 8}, {9, 16}};
  EXPECT_EQ(segs, want);
  EXPECT_EQ(router_gemm_measure_points(segs), (std::vector<int>{1, 2, 3, 4, 8, 9, 16}));
  EXPECT_THROW(router_gemm_segments({0, 4}), Error);
}

TEST(RouterGemmTuning, ChoiceNeedsMarginOverCublasAtEveryPoint) {
  // M=1: ours 2.0 vs cuBLAS 6.0 (wins). M=2..8: ours wins at 8 but only ties at 2: cuBLAS.
  // M=9..16: ours 0.98 x cuBLAS at both ends: inside the noise margin, cuBLAS.
  const std::vector<RouterGemmSegment> segs = {
      segment(1, 1, {{{kDot1, 2.0}, {kCublas, 6.0}}}),
      segment(2, 8, {{{kDot1, 6.1}, {kCublas, 6.2}}, {{kDot1, 5.0}, {kCublas, 8.0}}}),
      segment(9, 16, {{{kDot1, 6.86}, {kCublas, 7.0}}, {{kDot1, 6.86}, {kCublas, 7.0}}}),
  };
  const auto rows = select_router_gemm_rows(DType::BF16, 7168, 256, segs);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].row.config, kDot1);
  EXPECT_EQ(rows[0].row.m_min, 1);
  EXPECT_EQ(rows[0].row.m_max, 1);
  EXPECT_DOUBLE_EQ(rows[0].us_mean, 2.0);
  EXPECT_DOUBLE_EQ(rows[0].cublas_us_mean, 6.0);
  EXPECT_EQ(rows[1].row.config, kCublas);
  EXPECT_EQ(rows[1].row.m_min, 2);
  EXPECT_EQ(rows[1].row.m_max, 16);
}

TEST(RouterGemmTuning, ChoiceKeepsRunningConfigWithinTolerance) {
  // M=1: split dot best. M=2: kDot1 is 1% faster, within the 2% tolerance: the row continues.
  // M=3: kDot1 is 10% faster: new row. M=4: the running kDot1 stops winning: cuBLAS.
  const std::vector<RouterGemmSegment> segs = {
      segment(1, 1, {{{kDot1, 2.5}, {kDotSplit, 2.0}, {kCublas, 6.0}}}),
      segment(2, 2, {{{kDot1, 2.0}, {kDotSplit, 2.02}, {kCublas, 6.0}}}),
      segment(3, 3, {{{kDot1, 2.0}, {kDotSplit, 2.2}, {kCublas, 6.0}}}),
      segment(4, 4, {{{kDot1, 6.0}, {kDotSplit, 6.5}, {kCublas, 6.0}}}),
  };
  const auto rows = select_router_gemm_rows(DType::BF16, 7168, 256, segs);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].row.config, kDotSplit);
  EXPECT_EQ(rows[0].row.m_max, 2);
  EXPECT_EQ(rows[1].row.config, kDot1);
  EXPECT_EQ(rows[1].row.m_min, 3);
  EXPECT_EQ(rows[1].row.m_max, 3);
  EXPECT_EQ(rows[2].row.config, kCublas);
  EXPECT_EQ(rows[2].row.m_min, 4);
}

TEST(RouterGemmTuning, ChoiceIgnoresConfigsMissingAPointAndRejectsGaps) {
  // kDot1 has no time at M=8 (it failed there): it cannot cover 5..8 even though it wins at 5.
  const std::vector<RouterGemmSegment> segs = {
      segment(1, 4, {{{kDot1, 2.0}, {kCublas, 6.0}}, {{kDot1, 2.0}, {kCublas, 6.0}}}),
      segment(5, 8, {{{kDot1, 2.0}, {kDot4, 3.0}, {kCublas, 6.0}}, {{kDot4, 3.0}, {kCublas, 6.0}}}),
  };
  const auto rows = select_router_gemm_rows(DType::BF16, 7168, 256, segs);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].row.config, kDot4);
  EXPECT_EQ(rows[1].row.m_min, 5);
  const std::vector<RouterGemmSegment> gap = {segment(1, 1, {{{kCublas, 6.0}}}),
                                              segment(3, 3, {{{kCublas, 6.0}}})};
  EXPECT_THROW(select_router_gemm_rows(DType::BF16, 7168, 256, gap), Error);
}

TEST(RouterGemmTuning, SplitDotCandidatesOnlyAtDecodeM) {
  auto count_split = [](int k, int m) {
    int n = 0;
    for (const RouterGemmConfig& c : router_gemm_candidates(DType::BF16, k, 256, m)) {
      if (c.backend == RouterGemmBackend::Dot && c.split_k > 1) {
        ++n;
        EXPECT_LE(static_cast<long long>(c.split_k) * c.block * 4, k) << describe(c);
      }
    }
    return n;
  };
  EXPECT_GT(count_split(7168, 1), 0);
  EXPECT_GT(count_split(7168, 16), 0);
  EXPECT_EQ(count_split(7168, 17), 0);
  EXPECT_EQ(count_split(512, 1), 0);  // 2 x 128 x 4 > 512: most threads would idle
}

}  // namespace moekit::tuning
