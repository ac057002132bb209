// The MX prefill GEMM that reads the packed bytes itself (run_prefill_gemm_mx,
// cuda/prefill/prefill_mx.h): for both formats, gate/up (its held tiles pairing gate and up rows)
// and down (208 rows: a last n-tile of 80), both token tiles, its D against an fp64 sum over the
// CPU reference's dequantised weights (cpu_reference::dequant_row_mx), rounded to bf16 as the GEMM
// rounds: groups of 0, 1, a tile less one, a tile plus one and two tiles and more tokens; rows of a
// chunk and a part of one (the last K step half or a quarter full); exponents on both multiply
// paths and the subnormal 2^-127; D's rows past the groups' left as they were; run twice, bit for
// bit equal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cpu/reference_mx.h"
#include "cuda/prefill/prefill_mx.h"
#include "mx_matrices_test_util.h"
#include "prefill_test_util.h"

namespace moekit {
namespace {

using namespace moekit::test;

struct Case {
  ExpertFormat f;
  bool gate_up;
  int rows, k, tile_m;
};

TEST(GpuPrefillMxSmall, PackedGemmGivesTheReferenceProducts) {
  SKIP_WITHOUT_PREFILL_GPU();
  // MXFP4 k 4160: rows of 2080 bytes (a chunk and 32 bytes: the last step a quarter full);
  // k 2880 (gpt-oss: 1440 bytes, the last step half full); MXFP8 k 2112 (a chunk and 64 bytes)
  for (const Case c : {Case{ExpertFormat::Mxfp4, true, 256, 4160, 128},
                       Case{ExpertFormat::Mxfp4, false, 208, 2880, 64},
                       Case{ExpertFormat::Mxfp8, true, 256, 2112, 64},
                       Case{ExpertFormat::Mxfp8, false, 128, 2112, 128}}) {
    SCOPED_TRACE(std::string(expert_format_name(c.f)) + (c.gate_up ? " gate/up" : " down") + " " +
                 std::to_string(c.rows) + " x " + std::to_string(c.k) + ", tile_m " +
                 std::to_string(c.tile_m));
    const std::vector<int> tokens = {c.tile_m - 1, 0, 1, 2 * c.tile_m + 3, c.tile_m + 1};
    const int groups = static_cast<int>(tokens.size());
    // e8m0 bytes near 127 (weights of a few units); every 5th past the one-multiply range by
    // a little, every 13th the subnormal 0
    const uint8_t two_step = c.f == ExpertFormat::Mxfp4 ? 129 : 135;
    const RandomMxExperts x(c.f, c.gate_up, c.rows, c.k, groups, 29 + c.k,
                            [&](size_t i, std::mt19937& rng) {
                              return i % 13 == 0  ? uint8_t{0}
                                     : i % 5 == 0 ? static_cast<uint8_t>(two_step + rng() % 3)
                                                  : static_cast<uint8_t>(120 + rng() % 8);
                            });
    // activations: each group's rows one after another, then two guard rows of D
    std::vector<int> first(groups + 1, 0);
    for (int grp = 0; grp < groups; ++grp) first[grp + 1] = first[grp] + tokens[grp];
    const int total = first[groups];
    std::mt19937 rng(7 + c.rows);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<Bf16> a(static_cast<size_t>(total) * c.k);
    for (Bf16& v : a) v = float_to_bf16(normal(rng));
    const Dev packed(x.tiled), scales(x.tiled_scales), dev_a(a);
    const Dev d((static_cast<size_t>(total) + 2) * c.rows * sizeof(Bf16));
    std::vector<cuda::PrefillProblem> problems;
    std::vector<const __nv_bfloat16*> a_ptr;
    std::vector<__nv_bfloat16*> d_ptr;
    std::vector<int64_t> stride_a(groups, c.k), stride_d(groups, c.rows);
    for (int grp = 0; grp < groups; ++grp) {
      problems.push_back({tokens[grp], c.rows, c.k});
      a_ptr.push_back(dev_a.as<__nv_bfloat16>() + static_cast<size_t>(first[grp]) * c.k);
      d_ptr.push_back(d.as<__nv_bfloat16>() + static_cast<size_t>(first[grp]) * c.rows);
    }
    const Dev dev_problems(problems), dev_a_ptr(a_ptr), dev_d_ptr(d_ptr);
    const Dev dev_stride_a(stride_a), dev_stride_d(stride_d);
    cuda::PrefillGroupArrays arrays;
    arrays.problems = dev_problems.as<cuda::PrefillProblem>();
    arrays.a = dev_a_ptr.as<const __nv_bfloat16*>();
    arrays.d = dev_d_ptr.as<__nv_bfloat16*>();
    arrays.stride_a = dev_stride_a.as<int64_t>();
    arrays.stride_d = dev_stride_d.as<int64_t>();
    const cuda::MxMatrices m{
        c.f, c.gate_up, c.rows, c.k, packed.as<uint8_t>(), scales.as<uint8_t>()};
    d.poison();
    cuda::run_prefill_gemm_mx(m, arrays, groups, c.tile_m, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<Bf16> got = d.download<Bf16>();
    d.poison();
    cuda::run_prefill_gemm_mx(m, arrays, groups, c.tile_m, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<Bf16> again = d.download<Bf16>();

    int bad = 0;
    std::vector<Bf16> w(c.k);
    for (int grp = 0; grp < groups && bad < 5; ++grp) {
      const cpu_reference::MxRows rows{c.f, x.q.data() + grp * x.bytes,
                                       x.s.data() + grp * x.scale_bytes, x.row_bytes, x.groups};
      for (int r = 0; r < c.rows && bad < 5; ++r) {
        cpu_reference::dequant_row_mx(rows, r, c.k, w.data());
        for (int t = 0; t < tokens[grp] && bad < 5; ++t) {
          const Bf16* at = a.data() + static_cast<size_t>(first[grp] + t) * c.k;
          double sum = 0.0, mag = 0.0;
          for (int k = 0; k < c.k; ++k) {
            const double p = double(bf16_to_float(at[k])) * bf16_to_float(w[k]);
            sum += p;
            mag += std::fabs(p);
          }
          const size_t at_d = static_cast<size_t>(first[grp] + t) * c.rows + r;
          const double g = bf16_to_float(got[at_d]);
          // bf16's rounding of the sum (half an ulp: 2^-8 of it), and fp32 sums in another
          // order (a wrong element, of 2^12 or so, moves the sum by ~1e-3 of mag or more)
          const double tol = std::ldexp(std::fabs(sum), -8) + 1e-4 * mag;
          if (!(std::fabs(g - sum) <= tol)) {
            ADD_FAILURE() << "group " << grp << " token " << t << " row " << r << ": got " << g
                          << ", want " << sum << " (tolerance " << tol << ")";
            ++bad;
          }
        }
      }
    }
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i].bits != again[i].bits) {
        ADD_FAILURE() << "run to run: element " << i << " bits " << got[i].bits << " then "
                      << again[i].bits;
        break;
      }
    }
    for (size_t i = static_cast<size_t>(total) * c.rows; i < got.size(); ++i) {
      if (got[i].bits != 0xFFFF) {
        ADD_FAILURE() << "D's guard rows were written at element " << i;
        break;
      }
    }
  }
}

}  // namespace
}  // namespace moekit
