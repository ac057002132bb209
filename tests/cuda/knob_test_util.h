// The knob tests' pattern (tests/cuda/test_layer_small*.cpp): a knob of the plan
// (plan::PlanOverrides) turned off and on. First the plans (on the "sm90" profile, so this part
// runs without a GPU): which kernel instances each launches at each batch, asserted by name.
// Then, on the GPU, two layers made with the two settings forward the same inputs: the knob's
// output matches the CPU reference and equals the other's bit for bit (a knob moves work
// between CTAs, copies or rings, never changes a sum), and each layer runs the plan asserted.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "layer_test_util.h"
#include "moekit/plan.h"

namespace moekit::test {

// `o` with its stream forced to the bulk kernels (the knobs below are theirs).
inline plan::PlanOverrides bulk(plan::PlanOverrides o) {
  o.stream = plan::Stream::Bulk;
  return o;
}

// `o` with `field` set to `value`.
inline plan::PlanOverrides with(plan::PlanOverrides o, int plan::PlanOverrides::*field,
                                int value) {
  o.*field = value;
  return o;
}

inline plan::LayerPlan sm90_plan(const MoeSpec& spec, int tokens, FuseShared fuse,
                                 const plan::PlanOverrides& o, DType experts = DType::BF16,
                                 ExpertFormat mx = ExpertFormat::Bf16) {
  return plan::plan_layer(spec, tokens, fuse, o, plan::device_profile("sm90"), experts, mx);
}

// Whether the plan launches instance `kernel` (by name), with the plan's text when it does not
// do as `expected` says.
inline testing::AssertionResult plan_runs(const MoeSpec& spec, int tokens, FuseShared fuse,
                                          const plan::PlanOverrides& o, const std::string& kernel,
                                          DType experts = DType::BF16,
                                          ExpertFormat mx = ExpertFormat::Bf16) {
  const plan::LayerPlan p = sm90_plan(spec, tokens, fuse, o, experts, mx);
  const std::vector<std::string> names = plan_kernel_names(p);
  const bool runs = std::find(names.begin(), names.end(), kernel) != names.end();
  auto result = runs ? testing::AssertionSuccess() : testing::AssertionFailure();
  return result << "the plan " << (runs ? "runs " : "does not run ") << kernel << ":\n"
                << plan::describe(p);
}

// The layer with plan overrides `o`.
inline std::unique_ptr<cuda::GpuMoeLayer> create_with(const LayerWeights& w,
                                                      cuda::GpuLayerOptions opt,
                                                      const plan::PlanOverrides& o) {
  opt.overrides = o;
  return cuda::GpuMoeLayer::create(w, opt);
}

// The layer runs the instances the profile plans (the H200 is the "sm90" profile's device).
inline void expect_layer_runs_its_plan(const cuda::GpuMoeLayer& gpu, const MoeSpec& spec,
                                       int tokens, FuseShared fuse, const plan::PlanOverrides& o,
                                       const std::string& what, DType experts = DType::BF16,
                                       ExpertFormat mx = ExpertFormat::Bf16) {
  EXPECT_EQ(plan_kernel_names(gpu.plan(tokens, fuse)),
            plan_kernel_names(sm90_plan(spec, tokens, fuse, o, experts, mx)))
      << what << ": the layer's plan:\n"
      << plan::describe(gpu.plan(tokens, fuse));
}

// Two layers, made with overrides `off` and `on`, forward the same `tokens` (inputs seeded
// seed + T): on's output matches the CPU reference and off's equals it bit for bit. `knob` names
// the setting in failure messages.
inline void expect_knob_keeps_the_output(const MoeSpec& spec, const LayerWeights& w,
                                         const cuda::GpuLayerOptions& opt,
                                         const plan::PlanOverrides& off,
                                         const plan::PlanOverrides& on, const std::string& knob,
                                         std::initializer_list<int> tokens, FuseShared fuse,
                                         int seed) {
  const auto without = create_with(w, opt, off);
  const auto with_knob = create_with(w, opt, on);
  for (int t : tokens) {
    const std::vector<Bf16> x = random_x(t, spec.hidden, seed + t);
    std::ostringstream what;
    what << spec.name << " T=" << t << " fuse=" << fuse_shared_name(fuse) << " " << knob;
    expect_layer_runs_its_plan(*with_knob, spec, t, fuse, on, what.str() + " (on)");
    expect_layer_runs_its_plan(*without, spec, t, fuse, off, what.str() + " (off)");
    const ForwardResult g = with_knob->forward(x.data(), t, fuse);
    expect_layer_matches_cpu(spec, w, x.data(), t, g, fuse, what.str());
    EXPECT_EQ(without->forward(x.data(), t, fuse).y, g.y) << what.str() << " vs off";
  }
}

// expect_knob_keeps_the_output fused and unfused (fused only where the spec can fuse).
inline void expect_knob_keeps_the_output_both(const MoeSpec& spec, const LayerWeights& w,
                                              const cuda::GpuLayerOptions& opt,
                                              const plan::PlanOverrides& off,
                                              const plan::PlanOverrides& on,
                                              const std::string& knob,
                                              std::initializer_list<int> tokens, int seed) {
  for (FuseShared fuse : {FuseShared::On, FuseShared::Off}) {
    if (fuse == FuseShared::On && !spec.can_fuse_shared()) continue;
    expect_knob_keeps_the_output(spec, w, opt, off, on, knob, tokens, fuse, seed);
  }
}

}  // namespace moekit::test
