// Every family of configs/ on the GPU, scaled down (hidden 256, 32 experts, I = 128: the real
// parser on a shrunk copy of the real config) for T in {1, 2, 7, 32, 128, 257, 1000}, fused and
// unfused, with each kernel family forced (regs, regs-early, bulk, the grouped prefill path) and
// the plan's own choice:
//   - routing: the GPU's own logits routed by cpu_reference::route give exactly the GPU's ids
//     (selection is fp32 on both sides) and its weights to 1e-5
//   - layer:   y against cpu_reference::forward on every token whose ids agree (the CPU computes
//     its own logits in double, so a token tied to ~1e-6 may route differently; at most T/100
//     such tokens), relative error by norm <= 5e-3 (bf16 h and y)
//   - fused against unfused: the same routed ids, outputs equal to bf16 precision.
// The plan of each forced family launches only that family's instances (checked without a GPU).
#include <gtest/gtest.h>

#include <cctype>
#include <optional>
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

struct Case {
  std::string model;
  int tokens;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " T=" << c.tokens; }

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string n = info.param.model + "_T" + std::to_string(info.param.tokens);
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const auto& m : kModels) {
    for (int t : {1, 2, 7, 32, 128, 257, 1000}) out.push_back({m, t});
  }
  return out;
}

// The stream settings each case runs: each family forced, then the plan's own (nullopt).
const std::optional<plan::Stream> kStreams[] = {plan::Stream::Registers,
                                                plan::Stream::RegistersEarlyActs,
                                                plan::Stream::Bulk, plan::Stream::Grouped,
                                                std::nullopt};

std::string stream_text(const std::optional<plan::Stream>& s) {
  return s ? plan::stream_name(*s) : "plan's";
}

class GpuLayerFamily : public testing::TestWithParam<Case> {};

TEST_P(GpuLayerFamily, MatchesCpuReferenceFusedAndUnfused) {
  const Case c = GetParam();
  const MoeSpec spec = small_spec(c.model);
  const cuda::GpuLayerOptions opt = base_options(c.tokens);
  std::vector<FuseShared> modes{FuseShared::Off};
  if (spec.can_fuse_shared()) modes.push_back(FuseShared::On);
  for (const auto& s : kStreams) {
    if (!s) continue;
    plan::PlanOverrides o = opt.overrides;
    o.stream = s;
    for (FuseShared fuse : modes) {
      for (const plan::ExpertLaunch& l : sm90_plan(spec, c.tokens, fuse, o).experts) {
        const plan::ExpertKernel& k = plan::expert_kernels()[l.kernel];
        EXPECT_EQ(k.stream, *s) << c.model << " T=" << c.tokens << " " << l.role << ": "
                                << k.name << " under stream " << plan::stream_name(*s);
      }
    }
  }
  SKIP_WITHOUT_GPU();
  const int layer = spec.moe_layers.front();
  const auto w = make_random_weights(spec, layer, 11);
  const std::vector<Bf16> x = random_x(c.tokens, spec.hidden, 5 + c.tokens);
  std::vector<ForwardResult> cpu;
  for (FuseShared fuse : modes) cpu.push_back(cpu_reference::forward(*w, x.data(), c.tokens, fuse));
  for (const auto& s : kStreams) {
    plan::PlanOverrides o = opt.overrides;
    if (s) o.stream = s;
    const auto gpu = create_with(*w, opt, o);
    std::vector<ForwardResult> results;
    for (size_t m = 0; m < modes.size(); ++m) {
      std::ostringstream what;
      what << spec.name << " T=" << c.tokens << " fuse=" << fuse_shared_name(modes[m])
           << " stream=" << stream_text(s);
      SCOPED_TRACE(what.str());
      expect_layer_runs_its_plan(*gpu, spec, c.tokens, modes[m], o, what.str());
      const ForwardResult g = gpu->forward(x.data(), c.tokens, modes[m]);
      EXPECT_EQ(g.fused, modes[m] == FuseShared::On);
      const std::vector<float> logits = gpu->last_logits(c.tokens);
      expect_routing_matches_cpu(spec, *w, logits, g, what.str());
      expect_layer_matches(spec, c.tokens, g, cpu[m], what.str());
      results.push_back(g);
    }
    if (results.size() == 2) {
      const int k = spec.top_k;
      for (int t = 0; t < c.tokens; ++t) {
        for (int slot = 0; slot < k; ++slot) {
          ASSERT_EQ(results[0].routing.ids[t * k + slot],
                    results[1].routing.ids[t * results[1].routing.slots + slot])
              << "token " << t << " slot " << slot;
        }
      }
      const Diff d = compare_rows(results[1].y, results[0].y, spec.hidden,
                                  std::vector<bool>(c.tokens, true));
      // each is within 5e-3 of the reference above; the prefill path rounds its GEMM outputs to
      // bf16, the fused slots and the dense shared MLP at different points: within twice that
      const double tol = s == plan::Stream::Grouped ? 1e-2 : 5e-3;
      EXPECT_LE(d.rel_norm, tol) << spec.name << ": fused vs unfused, stream=" << stream_text(s);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, GpuLayerFamily, testing::ValuesIn(all_cases()), case_name);

}  // namespace
}  // namespace moekit
