// The CPU reference on fp8 experts, both modes (layer.h, Fp8Compute):
//   weight-only  against an independent dequantise-then-bf16 MLP written here, and bit for bit
//                against the bf16 reference on the bf16 (dequantised) load of the same checkpoint;
//   W8A8         against the formula written out here (activation quantised per 128 channels,
//                per-tile block sums scaled by a_scale x w_scale, h re-quantised), on edge tiles;
// routing identical to the bf16 routing (the router is not quantised), fused = unfused, and the
// activation quantiser's rules (all-zero group, ue8m0 rounding, round to nearest even).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fp8_test_util.h"
#include "io_test_util.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/weights.h"
#include "shrunk_spec.h"

namespace moekit {
namespace {

LoadOptions keep_fp8() {
  LoadOptions o;
  o.expert_format = ExpertFormat::Fp8Block;
  return o;
}

size_t tiles(size_t n) { return (n + 127) / 128; }

double silu_glu(double g, double u) { return g / (1.0 + std::exp(-g)) * u; }

// ---- the independent computations

// y[H] = down . (silu(gate . x) * (up . x)) over bf16 weights, in double.
std::vector<double> mlp_bf16(const Bf16* gate, const Bf16* up, const Bf16* down, size_t H, size_t I,
                             const std::vector<double>& x) {
  std::vector<double> h(I), y(H, 0.0);
  for (size_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (size_t k = 0; k < H; ++k) {
      g += double(bf16_to_float(gate[i * H + k])) * x[k];
      u += double(bf16_to_float(up[i * H + k])) * x[k];
    }
    h[i] = silu_glu(g, u);
  }
  for (size_t r = 0; r < H; ++r)
    for (size_t i = 0; i < I; ++i) y[r] += double(bf16_to_float(down[r * I + i])) * h[i];
  return y;
}

// Per 128 values: s = max(amax, 1e-4) / 448 in fp32, q = e4m3(v / s) by the exhaustive encoder.
void quantise(const std::vector<float>& v, std::vector<uint8_t>& q, std::vector<float>& s) {
  q.resize(v.size());
  s.resize(tiles(v.size()));
  for (size_t b = 0; b < s.size(); ++b) {
    float amax = 0;
    for (size_t k = b * 128; k < std::min(v.size(), b * 128 + 128); ++k)
      amax = std::max(amax, std::fabs(v[k]));
    s[b] = std::max(amax, 1e-4f) / 448.0f;
    for (size_t k = b * 128; k < std::min(v.size(), b * 128 + 128); ++k)
      q[k] = float_to_fp8_e4m3(v[k] / s[b]);
  }
}

// out[r] = sum_b (sum_{k in b} a[k] w[r][k]) * sa[b] * ws[r/128][b] for an [rows, n] matrix.
double w8a8_row(const uint8_t* w, const float* ws, size_t r, size_t n,
                const std::vector<uint8_t>& qa, const std::vector<float>& sa) {
  double acc = 0;
  for (size_t b = 0; b < tiles(n); ++b) {
    double p = 0;
    for (size_t k = b * 128; k < std::min(n, b * 128 + 128); ++k)
      p += double(test::e4m3_decode(qa[k])) * test::e4m3_decode(w[r * n + k]);
    acc += p * sa[b] * ws[(r / 128) * tiles(n) + b];
  }
  return acc;
}

std::vector<double> mlp_w8a8(const ExpertView& v, size_t H, size_t I, const Bf16* x) {
  std::vector<float> xf(H);
  for (size_t k = 0; k < H; ++k) xf[k] = bf16_to_float(x[k]);
  std::vector<uint8_t> qx;
  std::vector<float> sx;
  quantise(xf, qx, sx);
  const float* up_scale = v.w13_scale + tiles(I) * tiles(H);
  std::vector<float> h(I);
  for (size_t i = 0; i < I; ++i) {
    const double g = w8a8_row(v.w13_fp8, v.w13_scale, i, H, qx, sx);
    const double u = w8a8_row(v.w13_fp8 + I * H, up_scale, i, H, qx, sx);
    h[i] = bf16_to_float(float_to_bf16(static_cast<float>(silu_glu(g, u))));  // h is bf16
  }
  std::vector<uint8_t> qh;
  std::vector<float> sh;
  quantise(h, qh, sh);
  std::vector<double> y(H);
  for (size_t r = 0; r < H; ++r) y[r] = w8a8_row(v.w2_fp8, v.w2_scale, r, I, qh, sh);
  return y;
}

double max_rel(const std::vector<float>& a, const std::vector<double>& b) {
  double amax = 0, err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    amax = std::max(amax, std::fabs(b[i]));
    err = std::max(err, std::fabs(a[i] - b[i]));
  }
  return err / std::max(amax, 1e-30);
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  return max_rel(a, std::vector<double>(b.begin(), b.end()));
}

struct Case {
  const char* model;
  int hidden, inter, experts, layer;
};
// Edge tiles in both dimensions: H = 200 (one full tile + 72), I = 96 (one partial tile).
const Case kCases[] = {{"deepseek-v3", 200, 96, 16, 3},
                       {"minimax-m2", 160, 96, 12, 0},
                       {"deepseek-v3", 200, 128, 16, 3}};

class Fp8Reference : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case c = GetParam();
    spec_ = test::shrunk_spec(c.model, c.hidden, c.inter, c.experts);
    dir_ = test::scratch_dir("_" + std::to_string(GetParam().inter));
    test::write_fp8_checkpoint(spec_, c.layer, 21, false, dir_);
    f8_ = load_checkpoint_weights(spec_, c.layer, dir_, keep_fp8());
    b16_ = load_checkpoint_weights(spec_, c.layer, dir_);
    x_ = test::random_input(tokens_, c.hidden, 5, 2.0f);
  }
  MoeSpec spec_;
  std::string dir_;
  std::unique_ptr<LayerWeights> f8_, b16_;
  const int tokens_ = 6;
  std::vector<Bf16> x_;
};

TEST_P(Fp8Reference, WeightOnlyExpertIsTheDequantisedBf16Mlp) {
  const size_t H = spec_.hidden, I = spec_.expert_intermediate;
  for (int e : {0, 7}) {
    const ExpertView v = f8_->expert(e);
    const auto gate = test::dequantise(v.w13_fp8, v.w13_scale, I, H);
    const auto up = test::dequantise(v.w13_fp8 + I * H, v.w13_scale + tiles(I) * tiles(H), I, H);
    const auto down = test::dequantise(v.w2_fp8, v.w2_scale, H, I);
    for (int t = 0; t < tokens_; ++t) {
      const Bf16* xt = x_.data() + t * H;
      std::vector<double> xd(H);
      for (size_t k = 0; k < H; ++k) xd[k] = bf16_to_float(xt[k]);
      const auto want = mlp_bf16(gate.data(), up.data(), down.data(), H, I, xd);
      std::vector<float> got(H);
      cpu_reference::expert_forward(spec_, v, xt, got.data(), Fp8Compute::WeightOnly);
      EXPECT_LT(max_rel(got, want), 1e-6) << "expert " << e << ", token " << t;
    }
  }
}

TEST_P(Fp8Reference, W8A8ExpertIsTheBlockFormula) {
  const size_t H = spec_.hidden, I = spec_.expert_intermediate;
  for (int e : {1, 6}) {
    const ExpertView v = f8_->expert(e);
    for (int t = 0; t < tokens_; ++t) {
      const Bf16* xt = x_.data() + t * H;
      const auto want = mlp_w8a8(v, H, I, xt);
      std::vector<float> got(H);
      cpu_reference::expert_forward(spec_, v, xt, got.data(), Fp8Compute::W8A8);
      // fp32 output of a double computation on the same codes: only the final rounding differs
      EXPECT_LT(max_rel(got, want), 1e-6) << "expert " << e << ", token " << t;
      // and W8A8 is a different computation from weight-only
      std::vector<float> wo(H);
      cpu_reference::expert_forward(spec_, v, xt, wo.data(), Fp8Compute::WeightOnly);
      EXPECT_GT(max_rel(got, wo), 1e-5);
      EXPECT_LT(max_rel(got, wo), 0.2);
    }
  }
}

// Weight-only on fp8-held weights is the bf16 reference on the bf16 load, bit for bit; W8A8
// routes identically (the router never sees fp8) and stays near it.
TEST_P(Fp8Reference, LayerMatchesTheBf16LoadAndRoutesIdentically) {
  for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
    SCOPED_TRACE(fuse_shared_name(fuse));
    const ForwardResult ref = cpu_reference::forward(*b16_, x_.data(), tokens_, fuse);
    const ForwardResult wo =
        cpu_reference::forward(*f8_, x_.data(), tokens_, fuse, Fp8Compute::WeightOnly);
    const ForwardResult qa = cpu_reference::forward(*f8_, x_.data(), tokens_, fuse);
    EXPECT_EQ(wo.y, ref.y);
    for (const ForwardResult* r : {&wo, &qa}) {
      EXPECT_EQ(r->routing.ids, ref.routing.ids);
      EXPECT_EQ(r->routing.weights, ref.routing.weights);
      EXPECT_EQ(r->fused, ref.fused);
    }
    const double err = max_rel(qa.y, ref.y);
    EXPECT_GT(err, 0.0);
    EXPECT_LT(err, 0.1) << "W8A8 against the bf16 reference";
  }
}

// The shared expert as fused slots or as its own MLP: the same quantisation groups (one slot of
// width I = Is), the same products; only the combine order differs.
TEST_P(Fp8Reference, FusedEqualsUnfused) {
  if (!spec_.can_fuse_shared()) GTEST_SKIP() << spec_.name << " has no shared expert";
  for (Fp8Compute mode : {Fp8Compute::W8A8, Fp8Compute::WeightOnly}) {
    SCOPED_TRACE(fp8_compute_name(mode));
    const ForwardResult on = cpu_reference::forward(*f8_, x_.data(), tokens_, FuseShared::On, mode);
    const ForwardResult off =
        cpu_reference::forward(*f8_, x_.data(), tokens_, FuseShared::Off, mode);
    EXPECT_TRUE(on.fused);
    EXPECT_FALSE(off.fused);
    EXPECT_LT(max_rel(on.y, off.y), 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8Reference, ::testing::ValuesIn(kCases), [](const auto& info) {
  std::string n = info.param.model;
  n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
  return n + "_H" + std::to_string(info.param.hidden) + "_I" + std::to_string(info.param.inter);
});

// Two shared slots (DeepSeek-V2-Lite's shape, I = 128): the unfused shared MLP's 256-wide h is
// quantised in the same 128-groups as the two slots'.
TEST(Fp8ReferenceShared, TwoSlotsFusedEqualUnfused) {
  const MoeSpec spec = test::shrunk_spec("deepseek-v2-lite", 200, 128, 16);
  ASSERT_EQ(spec.shared_slots(), 2);
  const std::string dir = test::scratch_dir();
  test::write_fp8_checkpoint(spec, 1, 22, false, dir);
  const auto w = load_checkpoint_weights(spec, 1, dir, keep_fp8());
  const std::vector<Bf16> x = test::random_input(5, 200, 6, 1.0f);
  const ForwardResult on = cpu_reference::forward(*w, x.data(), 5, FuseShared::On);
  const ForwardResult off = cpu_reference::forward(*w, x.data(), 5, FuseShared::Off);
  EXPECT_LT(max_rel(on.y, off.y), 1e-6);
}

// ---- the activation quantiser

TEST(Fp8ActivationQuant, AllZeroGroupHasTheFlooredScaleAndZeroCodes) {
  std::vector<float> v(200, 0.0f);
  for (int k = 128; k < 200; ++k) v[k] = 0.01f * (k - 150);
  std::vector<uint8_t> q(200, 0xaa);
  std::vector<float> s(2);
  cpu_reference::quantize_activation_fp8(v.data(), 200, false, q.data(), s.data());
  EXPECT_EQ(s[0], 1e-4f / 448.0f);
  for (int k = 0; k < 128; ++k) EXPECT_EQ(q[k], 0) << k;
  float amax = 0.0f;  // the partial group's: v[199] = 0.49
  for (int k = 128; k < 200; ++k) amax = std::max(amax, std::fabs(v[k]));
  EXPECT_EQ(s[1], amax / 448.0f);
  EXPECT_EQ(q[199], 0x7e);  // the amax element is 448 (saturating any rounding above it)
}

TEST(Fp8ActivationQuant, AmaxMapsTo448AndTiesRoundToEven) {
  std::vector<float> v = {448.0f, 17.0f, -19.0f, 0.0f, -448.0f};
  std::vector<uint8_t> q(5);
  float s = 0;
  cpu_reference::quantize_activation_fp8(v.data(), 5, false, q.data(), &s);
  EXPECT_EQ(s, 1.0f);
  EXPECT_EQ(fp8_e4m3_to_float(q[0]), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(q[1]), 16.0f);   // between 16 and 18: the even mantissa
  EXPECT_EQ(fp8_e4m3_to_float(q[2]), -20.0f);  // between 18 and 20: the even mantissa
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(fp8_e4m3_to_float(q[4]), -448.0f);
}

TEST(Fp8ActivationQuant, Ue8m0RoundsTheScaleUpToAPowerOfTwo) {
  std::vector<float> v = {449.0f, 224.5f, 3.0f};
  std::vector<uint8_t> q(3);
  float s = 0;
  cpu_reference::quantize_activation_fp8(v.data(), 3, true, q.data(), &s);
  EXPECT_EQ(s, 2.0f);  // 449 / 448 rounded up
  EXPECT_EQ(fp8_e4m3_to_float(q[0]), 224.0f);
  EXPECT_EQ(fp8_e4m3_to_float(q[1]), 112.0f);
  EXPECT_EQ(fp8_e4m3_to_float(q[2]), 1.5f);
  float exact = 0;
  const float one = 448.0f;  // amax / 448 = 1, already a power of two: kept
  cpu_reference::quantize_activation_fp8(&one, 1, true, q.data(), &exact);
  EXPECT_EQ(exact, 1.0f);
}

TEST(Fp8Compute, NamesRoundTrip) {
  for (Fp8Compute m : {Fp8Compute::W8A8, Fp8Compute::WeightOnly})
    EXPECT_EQ(parse_fp8_compute(fp8_compute_name(m)), m);
  EXPECT_THROW(parse_fp8_compute("fp8"), Error);
}

}  // namespace
}  // namespace moekit
