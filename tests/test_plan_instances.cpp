// Every compiled expert-kernel instance is reachable: some configuration of the GPU tests' small
// shapes (plan_instance_search.h) plans a launch of it. An instance no plan reaches is dead code
// the GPU tests cannot cover; this test names it. One test per instance, named after it; each
// prints the configuration cuda/test_layer_instances.cpp runs for it.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "moekit/plan.h"
#include "plan/expert_kernels.h"
#include "plan_instance_search.h"

namespace moekit {
namespace {

class PlanInstance : public testing::TestWithParam<int> {};

TEST_P(PlanInstance, SomeSmallConfigurationLaunchesIt) {
  const int index = GetParam();
  const plan::ExpertKernel& k = plan::expert_kernels()[index];
  const auto& found = test::find_instance_cases()[index];
  ASSERT_TRUE(found.has_value())
      << "no plan of the searched configurations (the GPU tests' small shapes x T x one or two "
         "forced settings) launches instance "
      << k.name << " (" << plan::describe(k) << "): unreachable, or the search needs its shape";
  // the configuration reproduces: its plan launches the instance
  const MoeSpec spec = test::small_spec(found->shape.model, found->shape.hidden,
                                        found->shape.experts, found->shape.inter);
  const plan::LayerPlan p =
      plan::plan_layer(spec, found->tokens, found->fuse, found->overrides,
                       plan::device_profile("sm90"), found->experts, found->mx);
  EXPECT_TRUE(test::plan_launches(p, index)) << plan::describe(p);
  std::printf("%s: %s\n", k.name, found->text().c_str());
}

INSTANTIATE_TEST_SUITE_P(EveryInstance, PlanInstance,
                         testing::Range(0, plan::kNumExpertKernels),
                         [](const testing::TestParamInfo<int>& info) {
                           return std::string(plan::expert_kernels()[info.param].name);
                         });

}  // namespace
}  // namespace moekit
