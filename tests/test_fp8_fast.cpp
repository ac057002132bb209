// The fast CPU backend on fp8 experts (weight-only, per ISA this CPU runs): each ISA's row
// dequantiser gives bf16(fp8 x scale) bit for bit on every code; the layer on fp8-held weights
// equals the same backend on the bf16 load of the checkpoint bit for bit (same kernels on the
// same bf16 values) and the reference's weight-only mode to the fast backend's tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cpu/fast/kernels.h"
#include "fp8_test_util.h"
#include "io_test_util.h"
#include "moekit/cpu_fast.h"
#include "moekit/layer.h"
#include "shrunk_spec.h"

namespace moekit {
namespace {

using cpu_fast::Isa;

std::vector<Isa> isas() {
  static const std::vector<Isa> out = [] {
    std::vector<Isa> v = {Isa::Portable};
    for (Isa i : {Isa::Avx2, Isa::Avx512}) {
      if (cpu_fast::isa_supported(i))
        v.push_back(i);
      else
        std::printf("[ skipped  ] %s: not supported by this CPU\n", cpu_fast::isa_name(i));
    }
    return v;
  }();
  return out;
}

const cpu_fast::detail::Kernels& kernels(Isa isa) {
  if (isa == Isa::Avx512) return cpu_fast::detail::avx512_kernels();
  if (isa == Isa::Avx2) return cpu_fast::detail::avx2_kernels();
  return cpu_fast::detail::portable_kernels();
}

TEST(Fp8FastDequant, EveryCodeEveryIsaMatchesTheScalarDefinition) {
  // 2 tiles + 72 columns: the 16- and 8-wide steps and their tails; codes cycle through all
  // 254 finite ones (0x7f and 0xff are NaN), signed zeros and subnormals included.
  const int k = 328;
  std::vector<uint8_t> q(k);
  int code = 0;
  for (int c = 0; c < k; ++c) {
    if ((code & 0x7f) == 0x7f) ++code;
    q[c] = static_cast<uint8_t>(code++ & 0xff);
  }
  const float scales[3] = {0.0123f, 3.5e-3f, 1.0f / 1024};
  std::vector<Bf16> want(k), got(k);
  for (int c = 0; c < k; ++c) want[c] = float_to_bf16(fp8_e4m3_to_float(q[c]) * scales[c / 128]);
  for (Isa isa : isas()) {
    SCOPED_TRACE(cpu_fast::isa_name(isa));
    for (int n : {k, 200, 17, 7}) {
      std::fill(got.begin(), got.end(), Bf16{0xdead});
      kernels(isa).dequant_fp8_row(q.data(), scales, n, got.data());
      for (int c = 0; c < n; ++c)
        ASSERT_EQ(got[c].bits, want[c].bits)
            << "k " << n << ", column " << c << ", code 0x" << std::hex << int(q[c]);
      for (int c = n; c < k; ++c) ASSERT_EQ(got[c].bits, 0xdead) << "wrote past k = " << n;
    }
  }
}

// The fused decode kernels equal dequant_fp8_row + dot_rows_f32 (to fma contraction) and
// dequant_fp8_row + dot_rows_bf16 (bit for bit): rows crossing a tile row (r0 = 120), k with a
// partial tile and tails of every length, 1 and 2 tokens, and tile scales from ordinary ones to
// the edges of the AVX-512 kernels' lookup tables (2^-110, 2^110) and past them.
TEST(Fp8FastDequant, FusedRowKernelsEqualDequantiseThenDot) {
  const int rows = 16, r0 = 120, ld = 340;
  const size_t scale_ld = 3;
  std::vector<uint8_t> q(static_cast<size_t>(rows) * ld);
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
    if ((q[i] & 0x7f) == 0x7f) q[i] = 0x3a;
  }
  std::vector<float> x0(ld), x1(ld);
  std::vector<Bf16> xb0(ld), xb1(ld);
  for (int c = 0; c < ld; ++c) {
    x0[c] = std::sin(0.37f * c);
    x1[c] = std::cos(0.11f * c) - 0.5f;
    xb0[c] = float_to_bf16(x0[c]);
    xb1[c] = float_to_bf16(x1[c]);
  }
  const float* xs[2] = {x0.data(), x1.data()};
  const Bf16* xbs[2] = {xb0.data(), xb1.data()};
  const std::vector<std::vector<float>> scale_sets = {
      {0.013f / 7, 0.026f / 7, 0.039f / 7, 0.052f / 7, 0.065f / 7, 0.078f / 7},
      {0x1p-110f, 0x1p110f, 3e-34f, 2e33f, 1e-38f, 0x1p-111f},
      {1e-36f, 1.0f, 0x1.fffffep-111f, 0x1.000002p110f, 448.0f, 1e-6f}};
  for (Isa isa : isas()) {
    const auto& kern = kernels(isa);
    if (kern.dot_rows_fp8_f32 == nullptr) continue;
    SCOPED_TRACE(cpu_fast::isa_name(isa));
    for (const std::vector<float>& scale : scale_sets) {
      for (int k : {340, 256, 200, 129, 64, 31, 17, 5}) {
        std::vector<Bf16> w(static_cast<size_t>(rows) * k);
        for (int r = 0; r < rows; ++r)
          kern.dequant_fp8_row(q.data() + r * ld, scale.data() + ((r0 + r) / 128) * scale_ld, k,
                               w.data() + r * k);
        for (int n = 1; n <= kern.fp8_row_tokens; ++n) {
          SCOPED_TRACE("k " + std::to_string(k) + ", n " + std::to_string(n) + ", scale " +
                       std::to_string(scale[0]));
          std::vector<float> want(2 * rows), got(2 * rows, -1.0f);
          kern.dot_rows_f32(w.data(), k, rows, k, xs, n, want.data(), rows);
          kern.dot_rows_fp8_f32(q.data(), ld, scale.data(), scale_ld, r0, rows, k, xs, n,
                                got.data(), rows);
          // the same products summed in the same order; a compiler may contract a product and
          // its sum into one fma in one kernel and not in the other, so the two agree to a few
          // ulps of the sum, not always bit for bit
          for (int i = 0; i < n * rows; ++i) {
            double magnitude = 0;  // sum of |products|: the scale of the rounding differences
            for (int c = 0; c < k; ++c)
              magnitude +=
                  std::fabs(double(bf16_to_float(w[(i % rows) * k + c])) * xs[i / rows][c]);
            ASSERT_NEAR(got[i], want[i], 1e-6 * magnitude) << "fp32 activations, element " << i;
          }
          if (kern.dot_rows_fp8_bf16 == nullptr || !cpu_fast::cpu_has_avx512_bf16()) continue;
          std::fill(got.begin(), got.end(), -1.0f);
          kern.dot_rows_bf16(w.data(), k, rows, k, xbs, n, want.data(), rows);
          kern.dot_rows_fp8_bf16(q.data(), ld, scale.data(), scale_ld, r0, rows, k, xbs, n,
                                 got.data(), rows);
          for (int i = 0; i < n * rows; ++i)
            ASSERT_EQ(got[i], want[i]) << "bf16 activations, element " << i;
        }
      }
    }
  }
}

struct Case {
  const char* model;
  int hidden, inter, experts, layer;
};

class Fp8Fast : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8Fast, EqualsTheBf16LoadAndTheWeightOnlyReference) {
  const Case c = GetParam();
  const MoeSpec spec = test::shrunk_spec(c.model, c.hidden, c.inter, c.experts);
  const std::string dir = test::scratch_dir("_" + std::to_string(c.inter));
  test::write_fp8_checkpoint(spec, c.layer, 31, false, dir);
  LoadOptions keep;
  keep.expert_format = ExpertFormat::Fp8Block;
  const auto f8 = load_checkpoint_weights(spec, c.layer, dir, keep);
  const auto b16 = load_checkpoint_weights(spec, c.layer, dir);
  for (int tokens : {1, 3, 9}) {
    const std::vector<Bf16> x = test::random_input(tokens, c.hidden, 40 + tokens, 2.0f);
    for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
      const ForwardResult ref =
          cpu_reference::forward(*f8, x.data(), tokens, fuse, Fp8Compute::WeightOnly);
      double scale = 0;
      for (float v : ref.y) scale = std::max(scale, double(std::fabs(v)));
      for (Isa isa : isas()) {
        SCOPED_TRACE(std::string(cpu_fast::isa_name(isa)) + ", " + std::to_string(tokens) +
                     " tokens, fuse " + fuse_shared_name(fuse));
        cpu_fast::FastOptions opt;
        opt.isa = isa;
        opt.threads = 2;
        const ForwardResult a = cpu_fast::forward(*f8, x.data(), tokens, fuse, opt);
        const ForwardResult b = cpu_fast::forward(*b16, x.data(), tokens, fuse, opt);
        EXPECT_EQ(a.y, b.y);
        EXPECT_EQ(a.routing.ids, ref.routing.ids);
        double err = 0;
        for (size_t i = 0; i < a.y.size(); ++i)
          err = std::max(err, double(std::fabs(a.y[i] - ref.y[i])));
        EXPECT_LE(err, 2e-5 * scale);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8Fast,
                         ::testing::Values(Case{"deepseek-v3", 200, 96, 16, 3},
                                           Case{"minimax-m2", 160, 96, 12, 0},
                                           Case{"deepseek-v2-lite", 200, 128, 16, 1}),
                         [](const auto& info) {
                           std::string n = info.param.model;
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n + "_I" + std::to_string(info.param.inter);
                         });

}  // namespace
}  // namespace moekit
