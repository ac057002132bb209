// Tests of the fast CPU backend (src/cpu/fast/) against the CPU reference, the oracle.
//
// Every family's real config.json, scaled down, T in {1, 2, 7, 32, 128}, fused and unfused shared
// expert, every SIMD path this CPU can run (AVX-512 with and without vdpbf16ps, AVX2, portable;
// those the CPU lacks are skipped with a message), threads 1, 2 and 3 (3 > cores on the dev
// machine: uneven slices and an oversubscribed pool).
//
// Tolerance: the reference accumulates in double, the fast backend in fp32 (and vdpbf16ps adds
// pairs before accumulating). Measured max |fast - ref| / max |ref| is 2-3e-7 on the full-size
// Qwen3-30B-A3B and MiniMax-M2 layers for every ISA, so max |fast - ref| <= 2e-5 * max |ref|
// leaves a wide margin while catching any real mistake (a wrong weight, slot, bias or clamp
// moves y by >> 1e-3 of its scale). Routing must
// match exactly: the fast router also accumulates in double, so the logits are the same floats
// save for a rounding-boundary case that these seeds do not hit. For one ISA, y must be
// bit-identical whatever the thread count (each element is summed in one fixed order).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/random_values.h"
#include "expect_error.h"
#include "moekit/cpu_fast.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/spec.h"
#include "moekit/weights.h"
#include "shrunk_spec.h"

namespace moekit {
namespace {

using random_values::stream_key;
using random_values::Tensor;
using random_values::uniform;
using test::expect_error;

// Deliberately not multiples of the SIMD widths (32 bf16 / 16 / 8 floats) nor of the 4-row
// tiles: every kernel's tail path and remainder rows run. kExperts = 32 keeps DeepSeek-V3's 8
// groups of 4.
constexpr int kHidden = 102;
constexpr int kInter = 22;
constexpr int kExperts = 32;
constexpr double kRelTol = 2e-5;

const std::vector<std::string> kFamilies = {
    "deepseek-v3",    "deepseek-v2-lite", "deepseek-v4-flash", "kimi-k2",       "glm-4.5",
    "glm-5",          "minimax-m2",       "minimax-m3",        "qwen3-30b-a3b", "qwen3-235b-a22b",
    "qwen2-57b-a14b", "mixtral-8x7b",     "gpt-oss-120b"};

MoeSpec shrunk_spec(const std::string& model, int hidden = kHidden, int inter = kInter,
                    int experts = kExperts) {
  return test::shrunk_spec(model, hidden, inter, experts);
}
using test::random_input;

// The SIMD configurations to test on this CPU, with a message for each one skipped.
struct IsaCase {
  cpu_fast::Isa isa;
  bool bf16_dot;
  std::string name;
};

std::vector<IsaCase> isa_cases() {
  using cpu_fast::Isa;
  std::vector<IsaCase> cases;
  if (cpu_fast::isa_supported(Isa::Avx512)) {
    if (cpu_fast::cpu_has_avx512_bf16()) {
      cases.push_back({Isa::Avx512, true, "avx512+bf16dot"});
    } else {
      std::printf("[ skipped  ] avx512+bf16dot: this CPU has no AVX512-BF16\n");
    }
    cases.push_back({Isa::Avx512, false, "avx512"});
  } else {
    std::printf("[ skipped  ] avx512: this CPU lacks avx512f/bw/vl/dq\n");
  }
  if (cpu_fast::isa_supported(Isa::Avx2)) {
    cases.push_back({Isa::Avx2, false, "avx2"});
  } else {
    std::printf("[ skipped  ] avx2: this CPU lacks avx2/fma\n");
  }
  cases.push_back({Isa::Portable, false, "portable"});
  return cases;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float f : v) m = std::max(m, static_cast<double>(std::fabs(f)));
  return m;
}

// Compares fast with reference: routing exactly, y to kRelTol of the output's scale. Reports the
// first mismatching element.
void expect_matches(const ForwardResult& fast, const ForwardResult& ref, const std::string& what) {
  ASSERT_EQ(fast.tokens, ref.tokens) << what;
  ASSERT_EQ(fast.fused, ref.fused) << what;
  ASSERT_EQ(fast.routing.ids, ref.routing.ids) << what << ": routing picked other experts";
  ASSERT_EQ(fast.routing.weights.size(), ref.routing.weights.size()) << what;
  for (size_t i = 0; i < ref.routing.weights.size(); ++i)
    ASSERT_NEAR(fast.routing.weights[i], ref.routing.weights[i], 1e-6) << what << " slot " << i;
  ASSERT_EQ(fast.y.size(), ref.y.size()) << what;
  const double scale = max_abs(ref.y);
  ASSERT_GT(scale, 1e-3) << what << ": reference output is ~0, the comparison would be vacuous";
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < ref.y.size(); ++i) {
    const double d = std::fabs(static_cast<double>(fast.y[i]) - ref.y[i]);
    if (!(d <= worst)) {  // NaN-safe: a NaN becomes the worst
      worst = d;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, kRelTol * scale)
      << what << ": max |fast - ref| = " << worst << " at token " << worst_at / ref.hidden
      << " column " << worst_at % ref.hidden << " (fast " << fast.y[worst_at] << ", ref "
      << ref.y[worst_at] << "), max |ref| = " << scale;
}

// One family: every T, fuse mode, ISA and thread count against the reference.
void check_family(const std::string& model, float x_scale) {
  const MoeSpec spec = shrunk_spec(model);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 7);
  std::vector<FuseShared> fuses = {FuseShared::Auto};
  if (spec.shared_kind != SharedKind::None) fuses = {FuseShared::On, FuseShared::Off};
  const std::vector<IsaCase> isas = isa_cases();
  for (int tokens : {1, 2, 7, 32, 128}) {
    const std::vector<Bf16> x = random_input(tokens, spec.hidden, 100 + tokens, x_scale);
    for (FuseShared fuse : fuses) {
      const ForwardResult ref = cpu_reference::forward(*w, x.data(), tokens, fuse);
      for (const IsaCase& ic : isas) {
        std::vector<float> first_y;
        for (int threads : {1, 2, 3}) {
          cpu_fast::FastOptions opt;
          opt.threads = threads;
          opt.isa = ic.isa;
          opt.use_bf16_dot = ic.bf16_dot;
          std::ostringstream what;
          what << model << " x_scale " << x_scale << " T=" << tokens << " fuse "
               << fuse_shared_name(fuse) << " " << ic.name << " threads " << threads;
          SCOPED_TRACE(what.str());
          const ForwardResult fast = cpu_fast::forward(*w, x.data(), tokens, fuse, opt);
          expect_matches(fast, ref, what.str());
          if (first_y.empty()) {
            first_y = fast.y;
          } else {
            // bitwise: the split over threads never changes a sum's order
            EXPECT_TRUE(fast.y == first_y) << what.str() << ": y depends on the thread count";
          }
        }
      }
    }
  }
}

class CpuFastFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuFastFamily, MatchesReference) { check_family(GetParam(), 1.0f); }

// Large inputs push the pre-activations past the swiglu clamps (limit 7 for gpt-oss and
// MiniMax-M3, DeepSeek-V4's swiglu_limit) and the sigmoids into saturation.
TEST_P(CpuFastFamily, MatchesReferenceWithLargeInputs) { check_family(GetParam(), 24.0f); }

INSTANTIATE_TEST_SUITE_P(AllFamilies, CpuFastFamily, ::testing::ValuesIn(kFamilies),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           std::replace(n.begin(), n.end(), '.', '_');
                           return n;
                         });

TEST(CpuFast, ClampsAreActiveWithLargeInputs) {
  // Guards the premise of MatchesReferenceWithLargeInputs: some gate pre-activation exceeds the
  // limit, so the clamp path is really compared.
  const MoeSpec spec = shrunk_spec("gpt-oss-120b");
  ASSERT_GT(spec.swiglu_limit, 0.0f);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 7);
  const std::vector<Bf16> x = random_input(1, spec.hidden, 101, 24.0f);
  const ExpertView ex = w->expert(0);
  double max_g = 0;
  for (int i = 0; i < spec.expert_intermediate; ++i) {
    double g = 0;
    for (int h = 0; h < spec.hidden; ++h)
      g += bf16_to_float(ex.w13[static_cast<size_t>(i) * spec.hidden + h]) * bf16_to_float(x[h]);
    max_g = std::max(max_g, std::fabs(g));
  }
  EXPECT_GT(max_g, spec.swiglu_limit);
}

// Full-size shapes (the real H, I and E): the SIMD main loops without tails, large slices.
TEST(CpuFast, RealShapesMatchReference) {
  for (const std::string model : {"qwen3-30b-a3b", "minimax-m2"}) {
    const MoeSpec spec = load_spec(model);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 3);
    const int tokens = 3;
    const std::vector<Bf16> x = random_input(tokens, spec.hidden, 5, 1.0f);
    const ForwardResult ref = cpu_reference::forward(*w, x.data(), tokens, FuseShared::Auto);
    for (const IsaCase& ic : isa_cases()) {
      cpu_fast::FastOptions opt;
      opt.isa = ic.isa;
      opt.use_bf16_dot = ic.bf16_dot;
      const ForwardResult fast = cpu_fast::forward(*w, x.data(), tokens, FuseShared::Auto, opt);
      expect_matches(fast, ref, model + " " + ic.name);
    }
  }
}

// FastOptions::phases: forward() writes each phase's time, all of them inside the call's.
TEST(CpuFast, PhaseTimesAreWrittenAndFitTheCall) {
  const MoeSpec spec = shrunk_spec("deepseek-v3", 512, 64, 32);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 5);
  const int tokens = 7;
  const std::vector<Bf16> x = random_input(tokens, spec.hidden, 6, 1.0f);
  cpu_fast::PhaseTimes phases{-1, -1, -1, -1};
  cpu_fast::FastOptions opt;
  opt.threads = 2;
  opt.phases = &phases;
  const auto t0 = std::chrono::steady_clock::now();
  cpu_fast::forward(*w, x.data(), tokens, FuseShared::Auto, opt);
  const double call_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  for (double t : {phases.router, phases.gate_up, phases.down, phases.combine}) EXPECT_GE(t, 0.0);
  EXPECT_GT(phases.gate_up, 0.0);
  EXPECT_GT(phases.down, 0.0);
  EXPECT_LE(phases.router + phases.gate_up + phases.down + phases.combine, call_us);
}

// Shapes large enough that the router GEMM and the combine run as parallel phases (small ones run
// on the calling thread), checked against the reference with 1 and 3 threads.
TEST(CpuFast, LargerShapesUseParallelRouterAndCombine) {
  for (const std::string model : {"qwen3-30b-a3b", "deepseek-v3", "minimax-m2"}) {
    const MoeSpec spec = shrunk_spec(model, 1040, 48, 64);
    const auto w = make_random_weights(spec, spec.moe_layers.front(), 11);
    const int tokens = 160;
    ASSERT_GT(static_cast<double>(tokens) * spec.router_columns() * spec.hidden, 1e6);
    ASSERT_GT(static_cast<double>(tokens) * spec.top_k * spec.hidden, 1e6);
    const std::vector<Bf16> x = random_input(tokens, spec.hidden, 13, 1.0f);
    std::vector<FuseShared> fuses = {FuseShared::Auto};
    if (spec.shared_kind != SharedKind::None) fuses = {FuseShared::On, FuseShared::Off};
    for (FuseShared fuse : fuses) {
      const ForwardResult ref = cpu_reference::forward(*w, x.data(), tokens, fuse);
      std::vector<float> first_y;
      for (int threads : {1, 3}) {
        cpu_fast::FastOptions opt;
        opt.threads = threads;
        const std::string what =
            model + " fuse " + fuse_shared_name(fuse) + " threads " + std::to_string(threads);
        const ForwardResult fast = cpu_fast::forward(*w, x.data(), tokens, fuse, opt);
        expect_matches(fast, ref, what);
        if (first_y.empty()) {
          first_y = fast.y;
        } else {
          EXPECT_TRUE(fast.y == first_y) << what << ": y depends on the thread count";
        }
      }
    }
  }
}

// Experts wide enough that both GEMMs run big units before small ones (gate/up: 1024-row big
// units over 4096 of 6144 rows; down: 85-row big units over 170 of 256 rows), against the
// reference and bit for bit across thread counts.
TEST(CpuFast, WideExpertsRunBigUnitsThenSmallOnes) {
  const MoeSpec spec = shrunk_spec("mixtral-8x7b", 256, 6144, 8);
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 17);
  const int tokens = 5;
  const std::vector<Bf16> x = random_input(tokens, spec.hidden, 19, 1.0f);
  const ForwardResult ref = cpu_reference::forward(*w, x.data(), tokens, FuseShared::Auto);
  std::vector<float> first_y;
  for (int threads : {1, 2, 3}) {
    cpu_fast::FastOptions opt;
    opt.threads = threads;
    const std::string what = "threads " + std::to_string(threads);
    const ForwardResult fast = cpu_fast::forward(*w, x.data(), tokens, FuseShared::Auto, opt);
    expect_matches(fast, ref, what);
    if (first_y.empty()) {
      first_y = fast.y;
    } else {
      EXPECT_TRUE(fast.y == first_y) << what << ": y depends on the thread count";
    }
  }
}

// Weights whose expert `bad` fails to load (as a truncated checkpoint would): the error raised on a
// pool worker must reach the caller, and the pool must stay usable afterwards.
class FailingExpertWeights final : public LayerWeights {
 public:
  FailingExpertWeights(const LayerWeights& inner, int bad)
      : LayerWeights(inner.spec(), inner.layer()), inner_(inner), bad_(bad) {
    const MoeSpec& sp = inner.spec();
    const size_t router_bytes =
        static_cast<size_t>(sp.router_columns()) * sp.hidden * dtype_size(sp.router_dtype);
    const auto* rw = static_cast<const uint8_t*>(inner.router_weight());
    router_weight_.assign(rw, rw + router_bytes);
    if (inner.correction_bias()) {
      correction_bias_.assign(inner.correction_bias(), inner.correction_bias() + sp.num_experts);
    }
    if (inner.router_bias()) {
      router_bias_.assign(inner.router_bias(), inner.router_bias() + sp.num_experts);
    }
  }
  ExpertView expert(int e) const override {
    MK_CHECK(e != bad_, "expert " << e << " is unreadable (test)");
    return inner_.expert(e);
  }
  int materialised_experts() const override { return inner_.materialised_experts(); }
  std::string origin() const override { return "failing test weights"; }

 private:
  const LayerWeights& inner_;
  int bad_;
};

TEST(CpuFast, ExpertLoadErrorReachesCallerAndPoolSurvives) {
  const MoeSpec spec = shrunk_spec("qwen3-30b-a3b");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 7);
  const int tokens = 7;
  const std::vector<Bf16> x = random_input(tokens, spec.hidden, 21, 1.0f);
  const ForwardResult good = cpu_fast::forward(*w, x.data(), tokens, FuseShared::Auto);
  const int bad = good.routing.ids.back();
  const FailingExpertWeights failing(*w, bad);
  for (int threads : {1, 3}) {
    cpu_fast::FastOptions opt;
    opt.threads = threads;
    SCOPED_TRACE("threads " + std::to_string(threads));
    expect_error([&] { cpu_fast::forward(failing, x.data(), tokens, FuseShared::Auto, opt); },
                 {"expert " + std::to_string(bad) + " is unreadable"});
    const ForwardResult again = cpu_fast::forward(*w, x.data(), tokens, FuseShared::Auto, opt);
    EXPECT_TRUE(again.y == good.y) << "threads " << threads;
  }
}

TEST(CpuFast, ZeroTokens) {
  const MoeSpec spec = shrunk_spec("qwen3-30b-a3b");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 7);
  const ForwardResult r = cpu_fast::forward(*w, nullptr, 0, FuseShared::Auto);
  EXPECT_EQ(r.tokens, 0);
  EXPECT_TRUE(r.y.empty());
  EXPECT_TRUE(r.routing.ids.empty());
}

TEST(CpuFast, TouchesOnlyRoutedExperts) {
  const MoeSpec spec = shrunk_spec("deepseek-v3");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 7);
  const std::vector<Bf16> x = random_input(1, spec.hidden, 9, 1.0f);
  const ForwardResult r = cpu_fast::forward(*w, x.data(), 1, FuseShared::On);
  // k routed experts + the fused shared slot(s), nothing else
  EXPECT_EQ(w->materialised_experts(), spec.top_k + spec.shared_slots());
  EXPECT_EQ(r.routing.slots, spec.top_k + spec.shared_slots());
}

TEST(CpuFast, NonFiniteInputThrowsNamingTokenAndColumn) {
  const MoeSpec spec = shrunk_spec("qwen3-30b-a3b");
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 7);
  std::vector<Bf16> x = random_input(3, spec.hidden, 9, 1.0f);
  x[2 * spec.hidden + 5] = float_to_bf16(std::nanf(""));
  expect_error([&] { cpu_fast::forward(*w, x.data(), 3, FuseShared::Auto); },
               {"token 2", "column 5"});
}

TEST(CpuFast, FuseOnWithoutFusableSharedThrows) {
  const MoeSpec spec = shrunk_spec("qwen3-30b-a3b");  // no shared expert
  const auto w = make_random_weights(spec, spec.moe_layers.front(), 7);
  const std::vector<Bf16> x = random_input(1, spec.hidden, 9, 1.0f);
  EXPECT_THROW(cpu_fast::forward(*w, x.data(), 1, FuseShared::On), Error);
}

TEST(CpuFastIsa, ParseAndNames) {
  using cpu_fast::Isa;
  for (Isa i : {Isa::Auto, Isa::Avx512, Isa::Avx2, Isa::Portable})
    EXPECT_EQ(cpu_fast::parse_isa(cpu_fast::isa_name(i)), i);
  expect_error([] { cpu_fast::parse_isa("sse9"); }, {"'sse9'"});
  EXPECT_TRUE(cpu_fast::isa_supported(Isa::Portable));
  // Auto resolves to something this CPU runs, never to Auto.
  const Isa best = cpu_fast::resolve_isa(Isa::Auto);
  EXPECT_NE(best, Isa::Auto);
  EXPECT_TRUE(cpu_fast::isa_supported(best));
}

TEST(CpuFastIsa, EnvironmentOverridesAutoOnly) {
  using cpu_fast::Isa;
  const char* old = std::getenv("MOEKIT_CPU_ISA");
  const std::string saved = old ? old : "";
  setenv("MOEKIT_CPU_ISA", "portable", 1);
  EXPECT_EQ(cpu_fast::resolve_isa(Isa::Auto), Isa::Portable);
  if (cpu_fast::isa_supported(Isa::Avx2)) {
    EXPECT_EQ(cpu_fast::resolve_isa(Isa::Avx2), Isa::Avx2);  // an explicit request wins
  }
  setenv("MOEKIT_CPU_ISA", "avx9000", 1);
  EXPECT_THROW(cpu_fast::resolve_isa(Isa::Auto), Error);
  if (old) {
    setenv("MOEKIT_CPU_ISA", saved.c_str(), 1);
  } else {
    unsetenv("MOEKIT_CPU_ISA");
  }
}

TEST(CpuFastIsa, UnsupportedIsaThrows) {
  using cpu_fast::Isa;
  bool any_unsupported = false;
  for (Isa i : {Isa::Avx512, Isa::Avx2}) {
    if (cpu_fast::isa_supported(i)) continue;
    any_unsupported = true;
    EXPECT_THROW(cpu_fast::resolve_isa(i), Error) << cpu_fast::isa_name(i);
  }
  if (!any_unsupported) GTEST_SKIP() << "this CPU supports every ISA: no unsupported one to request";
}

TEST(CpuFast, NegativeThreadsThrows) {
  EXPECT_THROW(cpu_fast::resolve_threads(-1), Error);
  EXPECT_GE(cpu_fast::resolve_threads(0), 1);
  EXPECT_EQ(cpu_fast::resolve_threads(5), 5);
}

TEST(CpuFast, ReadBandwidthIsPositive) {
  const double bw = cpu_fast::measure_read_bandwidth(size_t{16} << 20, 0, 2);
  EXPECT_GT(bw, 1e8);  // > 0.1 GB/s: any machine that runs the tests
}

}  // namespace
}  // namespace moekit
