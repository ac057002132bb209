// The fast CPU backend on MX experts (per ISA this CPU runs): each ISA's row dequantiser gives
// the reference's bf16(element x 2^(s-127)) bit for bit on every code and on scales from the
// fp32-subnormal 2^-127 to the largest the loader accepts; the layer on MX-held weights equals
// the same backend on the bf16 load of the checkpoint bit for bit (the same bf16 values through
// the same kernels) and the reference to the fast backend's tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cpu/fast/kernels.h"
#include "cpu/reference_mx.h"
#include "io_test_util.h"
#include "moekit/cpu_fast.h"
#include "moekit/layer.h"
#include "mx_test_util.h"
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

// Every code against every listed scale: row i gives its 32-column block g the scale byte
// scales[(i + g) % n], so each code meets each scale and neighbouring blocks differ; each ISA's
// row equals the reference's and the test's own OCP-table dequantisation, and writes nothing
// past k.
void check_rows(ExpertFormat f, const std::vector<uint8_t>& q, int k,
                const std::vector<uint8_t>& scales) {
  for (size_t i = 0; i < scales.size(); ++i) {
    const uint8_t s = scales[i];
    std::vector<uint8_t> scale(k / 32);
    for (size_t g = 0; g < scale.size(); ++g) scale[g] = scales[(i + g) % scales.size()];
    std::vector<Bf16> want(k);
    cpu_reference::dequant_row_mx({f, q.data(), scale.data(), q.size(), scale.size()}, 0, k,
                                  want.data());
    const std::vector<Bf16> independent = test::mx_dequantise(f, q.data(), scale.data(), 1, k);
    ASSERT_TRUE(test::same_bits(want.data(), independent.data(), k)) << "scale " << int(s);
    for (Isa isa : isas()) {
      SCOPED_TRACE(std::string(cpu_fast::isa_name(isa)) + ", scale byte " + std::to_string(s));
      const auto& kern = kernels(isa);
      const auto row = f == ExpertFormat::Mxfp4 ? kern.dequant_mxfp4_row : kern.dequant_mxfp8_row;
      ASSERT_NE(row, nullptr);
      for (int n : {k, 64, 32}) {
        std::vector<Bf16> got(k + 8, Bf16{0xdead});
        row(q.data(), scale.data(), n, got.data());
        for (int c = 0; c < n; ++c)
          ASSERT_EQ(got[c].bits, want[c].bits) << "k " << n << ", column " << c;
        for (int c = n; c < k + 8; ++c) ASSERT_EQ(got[c].bits, 0xdead) << "wrote past k = " << n;
      }
    }
  }
}

TEST(MxFastDequant, Mxfp4EveryCodeEveryIsaMatchesTheReference) {
  // every byte value once: all 256 (low, high) nibble pairs, -0 (code 8) included
  const int k = 512;
  std::vector<uint8_t> q(k / 2);
  for (int i = 0; i < k / 2; ++i) q[i] = static_cast<uint8_t>((i * 97 + 13) % 256);
  // 2^-127 (an fp32 subnormal; its products round in bf16's subnormal range) to 2^125
  check_rows(ExpertFormat::Mxfp4, q, k, {0, 1, 2, 3, 7, 8, 9, 100, 126, 127, 128, 200, 252});
}

TEST(MxFastDequant, Mxfp8EveryCodeEveryIsaMatchesTheReference) {
  // the 254 finite e4m3fn codes (0x7f, 0xff are NaN), subnormals and -0 included, then two more
  const int k = 256;
  std::vector<uint8_t> q;
  for (int c = 0; c < 256 && int(q.size()) < k; ++c)
    if ((c & 0x7f) != 0x7f) q.push_back(static_cast<uint8_t>(c));
  q.push_back(0x01);
  q.push_back(0x81);
  ASSERT_EQ(int(q.size()), k);
  // 448 x 2^(246-127) is the largest finite product
  check_rows(ExpertFormat::Mxfp8, q, k, {0, 1, 5, 9, 10, 60, 119, 126, 127, 128, 200, 246});
}

// Two tokens of `ld` bf16 values, as fp32 (f0, f1) and as bf16 (b0, b1).
struct TwoTokens {
  std::vector<float> f0, f1;
  std::vector<Bf16> b0, b1;
  explicit TwoTokens(int ld) : f0(ld), f1(ld), b0(ld), b1(ld) {
    for (int c = 0; c < ld; ++c) {
      f0[c] = round_to_bf16(std::sin(0.37f * c));
      f1[c] = round_to_bf16(std::cos(0.11f * c) - 0.5f);
      b0[c] = float_to_bf16(f0[c]);
      b1[c] = float_to_bf16(f1[c]);
    }
  }
};

// The fused decode kernels equal dequant_mx*_row + dot_rows_f32 / dot_rows_bf16 (the same
// products summed in the same order; the fp8 test's fma-contraction slack is not needed: every
// product here is an explicit fma or vdpbf16ps) on blocks that take the exact path and the
// rounded one (scale bytes 0-2 and above 246 for MXFP8), 1 and 2 tokens, k with and without a
// 64-column tail.
TEST(MxFastDequant, FusedRowKernelsEqualDequantiseThenDot) {
  const int rows = 6, ld = 352;  // 11 blocks
  const uint8_t scale_bytes[] = {0, 1, 2, 3, 100, 127, 130, 246, 247, 250, 254};
  for (ExpertFormat f : {ExpertFormat::Mxfp4, ExpertFormat::Mxfp8}) {
    const bool fp4 = f == ExpertFormat::Mxfp4;
    const size_t ldq = fp4 ? ld / 2 : ld, lds = ld / 32;
    std::vector<uint8_t> q(rows * ldq), scale(rows * lds);
    for (size_t r = 0; r < size_t(rows); ++r) {
      for (size_t g = 0; g < lds; ++g) {
        const uint8_t s = scale_bytes[(g + 3 * r) % 11];
        // large scales keep the sums finite: MXFP4 capped at 2^113, MXFP8 above 246 (the
        // rounded path) with subnormal codes only
        scale[r * lds + g] = fp4 ? std::min<uint8_t>(s, 240) : s;
        for (size_t c = g * 32; c < g * 32 + 32; ++c) {
          uint8_t code = static_cast<uint8_t>((r * 131 + c * 37 + 5) % 256);
          if (fp4) {
            q[r * ldq + c / 2] |= static_cast<uint8_t>((code & 15) << (4 * (c % 2)));
          } else {
            if ((code & 0x7f) == 0x7f) code = 0x11;
            if (s > 246) code &= 0x87;  // |value| <= 7 x 2^-9
            q[r * ldq + c] = code;
          }
        }
      }
    }
    const TwoTokens t(ld);
    const float* xs[2] = {t.f0.data(), t.f1.data()};
    const Bf16* xb[2] = {t.b0.data(), t.b1.data()};
    for (Isa isa : isas()) {
      const auto& kern = kernels(isa);
      const auto f32 = fp4 ? kern.dot_rows_mxfp4_f32 : kern.dot_rows_mxfp8_f32;
      const auto bf16 = fp4 ? kern.dot_rows_mxfp4_bf16 : kern.dot_rows_mxfp8_bf16;
      const auto dequant = fp4 ? kern.dequant_mxfp4_row : kern.dequant_mxfp8_row;
      if (f32 == nullptr) continue;
      SCOPED_TRACE(std::string(cpu_fast::isa_name(isa)) + (fp4 ? ", mxfp4" : ", mxfp8"));
      for (int k : {352, 320, 64, 32}) {
        std::vector<Bf16> w(static_cast<size_t>(rows) * k);
        for (int r = 0; r < rows; ++r)
          dequant(q.data() + r * ldq, scale.data() + r * lds, k, w.data() + r * k);
        for (int n = 1; n <= kern.mx_row_tokens; ++n) {
          std::vector<float> want(2 * rows), got(2 * rows, -1.0f);
          kern.dot_rows_f32(w.data(), k, rows, k, xs, n, want.data(), rows);
          f32(q.data(), ldq, scale.data(), lds, rows, k, xs, n, got.data(), rows);
          for (int i = 0; i < n * rows; ++i)
            ASSERT_EQ(got[i], want[i]) << "f32, k " << k << ", n " << n << ", element " << i;
          if (bf16 == nullptr || kern.dot_rows_bf16 == nullptr || !cpu_fast::cpu_has_avx512_bf16())
            continue;
          std::fill(got.begin(), got.end(), -1.0f);
          kern.dot_rows_bf16(w.data(), k, rows, k, xb, n, want.data(), rows);
          bf16(q.data(), ldq, scale.data(), lds, rows, k, xb, n, got.data(), rows);
          for (int i = 0; i < n * rows; ++i)
            ASSERT_EQ(got[i], want[i]) << "bf16, k " << k << ", n " << n << ", element " << i;
        }
      }
    }
  }
}

// The VBMI MXFP4 rows (fp32 and bf16 activations) equal the AVX-512 ones bit for bit (the same
// weights summed in the same order) on every byte of codes against scales across the range, 1
// and 2 tokens, gpt-oss's 2880 columns and k with and without a 64-column tail; the AVX-512
// table holds them on a VBMI CPU.
TEST(MxFastDequant, VbmiMxfp4RowsEqualTheAvx512Rows) {
  if (!cpu_fast::isa_supported(Isa::Avx512) || !cpu_fast::detail::cpu_has_avx512_vbmi())
    GTEST_SKIP() << "needs AVX-512 with VBMI";
  const bool bf16 = cpu_fast::cpu_has_avx512_bf16();
  const auto& table = cpu_fast::detail::avx512_kernels();
  EXPECT_EQ(table.dot_rows_mxfp4_f32, &cpu_fast::detail::dot_rows_mxfp4_f32_avx512vbmi);
  EXPECT_EQ(table.dot_rows_mxfp4_bf16, &cpu_fast::detail::dot_rows_mxfp4_bf16_avx512vbmi);
  const int rows = 5, ld = 2880;
  const size_t ldq = ld / 2, lds = ld / 32;
  std::vector<uint8_t> q(rows * ldq), scale(rows * lds);
  uint32_t state = 12345;
  const auto next = [&state] { return state = state * 1664525u + 1013904223u; };
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint8_t>(next() >> 24);
  // scale bytes 0 (2^-127) to 240 (the sums stay finite)
  for (size_t i = 0; i < scale.size(); ++i) scale[i] = static_cast<uint8_t>((next() >> 24) % 241);
  const TwoTokens t(ld);
  const float* xf[2] = {t.f0.data(), t.f1.data()};
  const Bf16* xb[2] = {t.b0.data(), t.b1.data()};
  for (int k : {2880, 352, 320, 64, 32}) {
    for (int n = 1; n <= 2; ++n) {
      const auto check = [&](const char* what, const std::vector<float>& want,
                             const std::vector<float>& got) {
        for (int i = 0; i < n * rows; ++i) {
          ASSERT_TRUE(std::isfinite(want[i])) << what << ", k " << k << ", n " << n << ", " << i;
          ASSERT_EQ(got[i], want[i]) << what << ", k " << k << ", n " << n << ", element " << i;
        }
      };
      std::vector<float> want(2 * rows, -1.0f), got(2 * rows, -2.0f);
      cpu_fast::detail::dot_rows_mxfp4_f32_avx512(q.data(), ldq, scale.data(), lds, rows, k, xf, n,
                                                  want.data(), rows);
      cpu_fast::detail::dot_rows_mxfp4_f32_avx512vbmi(q.data(), ldq, scale.data(), lds, rows, k, xf,
                                                      n, got.data(), rows);
      check("fp32", want, got);
      if (!bf16) continue;
      cpu_fast::detail::dot_rows_mxfp4_bf16_avx512(q.data(), ldq, scale.data(), lds, rows, k, xb, n,
                                                   want.data(), rows);
      cpu_fast::detail::dot_rows_mxfp4_bf16_avx512vbmi(q.data(), ldq, scale.data(), lds, rows, k,
                                                       xb, n, got.data(), rows);
      check("bf16", want, got);
    }
  }
}

struct Case {
  const char* name;
  ExpertFormat format;
  bool stacked;
  int layer;
};

class MxFast : public ::testing::TestWithParam<Case> {};

TEST_P(MxFast, EqualsTheBf16LoadAndTheReference) {
  const Case c = GetParam();
  const MoeSpec spec = c.format == ExpertFormat::Mxfp4
                           ? test::mx_spec("gpt-oss-120b", 160, 96, 12, 0)
                           : test::mx_spec("minimax-m3", 160, 96, 12, 2, test::mxfp8_quant());
  const std::string dir = test::scratch_dir();
  test::write_mx_checkpoint(spec, c.layer, 41, c.format, c.stacked, dir);
  LoadOptions keep;
  keep.expert_format = c.format;
  const auto mx = load_checkpoint_weights(spec, c.layer, dir, keep);
  const auto b16 = load_checkpoint_weights(spec, c.layer, dir);
  for (int tokens : {1, 3, 9}) {
    const std::vector<Bf16> x = test::random_input(tokens, spec.hidden, 50 + tokens, 2.0f);
    for (FuseShared fuse : {FuseShared::Off, FuseShared::Auto}) {
      const ForwardResult ref = cpu_reference::forward(*mx, x.data(), tokens, fuse);
      double scale = 0;
      for (float v : ref.y) scale = std::max(scale, double(std::fabs(v)));
      ASSERT_GT(scale, 0.0);
      for (Isa isa : isas()) {
        SCOPED_TRACE(std::string(cpu_fast::isa_name(isa)) + ", " + std::to_string(tokens) +
                     " tokens, fuse " + fuse_shared_name(fuse));
        cpu_fast::FastOptions opt;
        opt.isa = isa;
        opt.threads = 2;
        const ForwardResult a = cpu_fast::forward(*mx, x.data(), tokens, fuse, opt);
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

INSTANTIATE_TEST_SUITE_P(Formats, MxFast,
                         ::testing::Values(Case{"GptOssMxfp4", ExpertFormat::Mxfp4, false, 0},
                                           Case{"MiniMaxMxfp8", ExpertFormat::Mxfp8, false, 3},
                                           Case{"MiniMaxMxfp8Stacked", ExpertFormat::Mxfp8, true,
                                                3}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace moekit
