// The CPU reference on MX experts (W4A16 / W8A16): an MX-held expert is the bf16 MLP of the
// weights dequantised by the OCP tables written out in the test (bit for bit), the whole layer
// equals the bf16 load of the same checkpoint bit for bit and routes identically, and the
// MiniMax-M3-like layer's fused shared slots equal the unfused shared MLP.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "io_test_util.h"
#include "moekit/layer.h"
#include "moekit/weights.h"
#include "mx_test_util.h"
#include "shrunk_spec.h"

namespace moekit {
namespace {

struct Case {
  const char* name;
  ExpertFormat format;
  bool stacked;
  int layer;
};

MoeSpec spec_of(const Case& c) {
  if (c.format == ExpertFormat::Mxfp4) return test::mx_spec("gpt-oss-120b", 96, 64, 8, 0);
  return test::mx_spec("minimax-m3", 96, 64, 8, 2, test::mxfp8_quant());
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, double(std::fabs(b[i])));
    err = std::max(err, double(std::fabs(a[i] - b[i])));
  }
  return scale > 0 ? err / scale : err;
}

class MxReference : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case c = GetParam();
    spec_ = spec_of(c);
    dir_ = test::scratch_dir();
    test::write_mx_checkpoint(spec_, c.layer, 21, c.format, c.stacked, dir_);
    LoadOptions o;
    o.expert_format = c.format;
    mx_ = load_checkpoint_weights(spec_, c.layer, dir_, o);
    b16_ = load_checkpoint_weights(spec_, c.layer, dir_);
  }
  MoeSpec spec_;
  std::string dir_;
  std::unique_ptr<LayerWeights> mx_, b16_;
};

TEST_P(MxReference, ExpertIsTheBf16MlpOfTheIndependentlyDequantisedWeights) {
  const size_t H = spec_.hidden, I = spec_.expert_intermediate;
  const std::vector<Bf16> x = test::random_input(1, spec_.hidden, 5, 2.0f);
  for (int e = 0; e < spec_.num_experts + spec_.shared_slots(); ++e) {
    const ExpertView v = mx_->expert(e);
    const std::vector<Bf16> w13 =
        test::mx_dequantise(v.mx_format, v.w13_mx, v.w13_mx_scale, 2 * I, H);
    const std::vector<Bf16> w2 = test::mx_dequantise(v.mx_format, v.w2_mx, v.w2_mx_scale, H, I);
    ExpertView plain;
    plain.w13 = w13.data();
    plain.w2 = w2.data();
    plain.b13 = v.b13;
    plain.b2 = v.b2;
    std::vector<float> got(H, -1.0f), want(H, -2.0f);
    cpu_reference::expert_forward(spec_, v, x.data(), got.data());
    cpu_reference::expert_forward(spec_, plain, x.data(), want.data());
    EXPECT_EQ(got, want) << "expert " << e;
  }
}

TEST_P(MxReference, LayerEqualsTheBf16LoadAndRoutesIdentically) {
  for (int tokens : {1, 4}) {
    const std::vector<Bf16> x = test::random_input(tokens, spec_.hidden, 30 + tokens, 2.0f);
    for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
      SCOPED_TRACE(std::to_string(tokens) + " tokens, fuse " + fuse_shared_name(fuse));
      const ForwardResult a = cpu_reference::forward(*mx_, x.data(), tokens, fuse);
      const ForwardResult b = cpu_reference::forward(*b16_, x.data(), tokens, fuse);
      EXPECT_EQ(a.y, b.y);
      EXPECT_EQ(a.routing.ids, b.routing.ids);
      EXPECT_EQ(a.routing.weights, b.routing.weights);
      double amax = 0;
      for (float v : a.y) amax = std::max(amax, double(std::fabs(v)));
      EXPECT_GT(amax, 0.0);
    }
  }
}

// The shared expert as two fused slots or as its own MLP: the same dequantised weights, only the
// combine order differs.
TEST_P(MxReference, FusedEqualsUnfused) {
  if (!spec_.can_fuse_shared()) GTEST_SKIP() << spec_.name << " has no shared expert";
  ASSERT_EQ(spec_.shared_slots(), 2);
  const std::vector<Bf16> x = test::random_input(5, spec_.hidden, 6, 1.0f);
  const ForwardResult on = cpu_reference::forward(*mx_, x.data(), 5, FuseShared::On);
  const ForwardResult off = cpu_reference::forward(*mx_, x.data(), 5, FuseShared::Off);
  EXPECT_TRUE(on.fused);
  EXPECT_FALSE(off.fused);
  EXPECT_LT(max_rel(on.y, off.y), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Formats, MxReference,
                         ::testing::Values(Case{"GptOssMxfp4", ExpertFormat::Mxfp4, false, 0},
                                           Case{"MiniMaxMxfp8", ExpertFormat::Mxfp8, false, 3},
                                           Case{"MiniMaxMxfp8Stacked", ExpertFormat::Mxfp8, true,
                                                3}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace moekit
