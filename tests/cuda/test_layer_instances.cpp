// Every expert-kernel instance on the GPU, one test per instance (named after it): the
// configuration plan_instance_search.h finds for it (a small shape, T, fusion, overrides), whose
// plan launches the instance, runs against the CPU reference and twice bit for bit. The overrides
// are the configuration's own, not the environment's, so that the instance under test runs.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../fp8_test_util.h"
#include "../io_test_util.h"
#include "../plan_instance_search.h"
#include "knob_test_util.h"
#include "layer_test_util.h"
#include "moekit/cuda_layer.h"
#include "moekit/plan.h"
#include "plan/expert_kernels.h"

namespace moekit {
namespace {

using namespace moekit::test;

class GpuLayerInstance : public testing::TestWithParam<int> {};

TEST_P(GpuLayerInstance, MatchesCpuReferenceAndItself) {
  const int index = GetParam();
  const plan::ExpertKernel& k = plan::expert_kernels()[index];
  const auto& found = find_instance_cases()[index];
  ASSERT_TRUE(found.has_value()) << "no configuration launches " << k.name
                                 << " (the CPU test PlanInstance.* says the same)";
  const InstanceCase& c = *found;
  MoeSpec spec = small_spec(c.shape.model, c.shape.hidden, c.shape.experts, c.shape.inter);
  if (c.mx == ExpertFormat::Mxfp8) {
    // (the family's config as a MiniMax-M3-style MXFP8 export declares it: tests/mx_test_util.h)
    spec.quant = QuantSpec{.kind = QuantKind::Mxfp8,
                           .block_out = 1,
                           .block_in = 32,
                           .activation_scheme = "dynamic",
                           .modules_to_not_convert = {"gate", "e_score_correction_bias"}};
  }
  ASSERT_TRUE(plan_runs(spec, c.tokens, c.fuse, c.overrides, k.name, c.experts, c.mx)) << c.text();
  std::printf("%s: %s\n", k.name, c.text().c_str());
  SKIP_WITHOUT_GPU();
  const bool fp8 = c.experts == DType::F8_E4M3;
  // fp8 / MX: the random weights through a checkpoint of the project's writer in that format,
  // loaded as it is stored
  std::unique_ptr<LayerWeights> w;
  if (c.mx != ExpertFormat::Bf16) {
    const std::string dir = scratch_dir();
    const auto bf16 = make_random_weights(spec, spec.moe_layers.front(), 200 + index);
    SaveCheckpointOptions so;
    so.expert_format = c.mx;
    save_checkpoint(*bf16, dir, so);
    LoadOptions lo;
    lo.expert_format = c.mx;
    w = load_checkpoint_weights(spec, spec.moe_layers.front(), dir, lo);
  } else if (fp8) {
    const std::string dir = scratch_dir();
    write_fp8_checkpoint(spec, spec.moe_layers.front(), 200 + index, false, dir);
    LoadOptions lo;
    lo.expert_format = ExpertFormat::Fp8Block;
    w = load_checkpoint_weights(spec, spec.moe_layers.front(), dir, lo);
  } else {
    w = make_random_weights(spec, spec.moe_layers.front(), 200 + index);
  }
  cuda::GpuLayerOptions opt;
  opt.max_tokens = c.tokens;
  opt.overrides = c.overrides;
  const auto gpu = cuda::GpuMoeLayer::create(*w, opt);
  const std::string what = std::string(k.name) + ": " + c.text();
  expect_layer_runs_its_plan(*gpu, spec, c.tokens, c.fuse, c.overrides, what, c.experts, c.mx);
  const std::vector<Bf16> x = random_x(c.tokens, spec.hidden, 300 + index);
  const ForwardResult first = gpu->forward(x.data(), c.tokens, c.fuse);
  expect_layer_matches(spec, c.tokens, first,
                       cpu_reference::forward(*w, x.data(), c.tokens, c.fuse, Fp8Compute::W8A8),
                       what);
  for (int rep = 1; rep <= 2; ++rep) {
    EXPECT_EQ(gpu->forward(x.data(), c.tokens, c.fuse).y, first.y) << what << ": forward " << rep + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryInstance, GpuLayerInstance,
                         testing::Range(0, plan::kNumExpertKernels),
                         [](const testing::TestParamInfo<int>& info) {
                           return std::string(plan::expert_kernels()[info.param].name);
                         });

}  // namespace
}  // namespace moekit
