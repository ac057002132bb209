// The MX prefill path's widening (cuda/prefill/prefill_mx.h): random packed matrices in the MX
// kernels' layout (tiled, words reordered: experts_mx_layout.h) widened on the GPU give the CPU
// reference's dequantised rows (cpu_reference::dequant_row_mx on the natural layout) bit for bit,
// for both formats, gate/up and down, rows of two chunks with a partial one, exponents on both
// multiply paths and the subnormal 2^-127; an expert without rows is left as it was.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/reference_mx.h"
#include "cuda/experts/experts_mx_layout.h"
#include "cuda/prefill/prefill_mx.h"
#include "mx_matrices_test_util.h"
#include "prefill_test_util.h"

namespace moekit {
namespace {

using namespace moekit::test;

struct Matrix {
  ExpertFormat f;
  bool gate_up;
  int rows, k;
};

TEST(GpuPrefillMxSmall, WideningGivesTheReferenceWeights) {
  SKIP_WITHOUT_PREFILL_GPU();
  // MXFP4 k 4160: rows of 2080 bytes (a chunk and 32 bytes); MXFP8 k 2112 (a chunk and 64)
  for (const Matrix m :
       {Matrix{ExpertFormat::Mxfp4, true, 32, 4160}, Matrix{ExpertFormat::Mxfp4, false, 48, 4160},
        Matrix{ExpertFormat::Mxfp8, true, 64, 2112}, Matrix{ExpertFormat::Mxfp8, false, 16, 192}}) {
    SCOPED_TRACE(std::string(expert_format_name(m.f)) + (m.gate_up ? " gate/up" : " down") + " " +
                 std::to_string(m.rows) + " x " + std::to_string(m.k));
    constexpr int kExperts = 3;
    // mostly near 127; every 7th past the one-multiply range, every 11th the subnormal 0
    const RandomMxExperts x(m.f, m.gate_up, m.rows, m.k, kExperts, 17 + m.rows,
                            [](size_t i, std::mt19937& rng) {
                              return i % 11 == 0  ? uint8_t{0}
                                     : i % 7 == 0 ? static_cast<uint8_t>(200 + rng() % 50)
                                                  : static_cast<uint8_t>(110 + rng() % 30);
                            });
    const size_t row_bytes = x.row_bytes, groups = x.groups;
    const size_t bytes = x.bytes, scale_bytes = x.scale_bytes;
    const std::vector<uint8_t>&q = x.q, &s = x.s;
    const std::vector<uint8_t>&tiled = x.tiled, &tiled_scales = x.tiled_scales;
    const Dev packed(tiled), scales(tiled_scales);
    // expert 1 has no rows: its widening is skipped
    std::vector<cuda::PrefillProblem> problems = {
        {5, m.rows, m.k}, {0, m.rows, m.k}, {1, m.rows, m.k}};
    const Dev dev_problems(problems);
    const size_t elems = static_cast<size_t>(m.rows) * m.k;
    const Dev out(kExperts * elems * sizeof(Bf16));
    out.poison();
    cuda::MxMatrices mm{m.f, m.gate_up, m.rows, m.k, packed.as<uint8_t>(), scales.as<uint8_t>()};
    // experts 1 and 2 of the three, into out[0..1]; then expert 0 into out[2]
    cuda::launch_mx_widen(mm, 1, 2, dev_problems.as<cuda::PrefillProblem>(),
                          out.as<__nv_bfloat16>(), nullptr);
    cuda::launch_mx_widen(mm, 0, 1, nullptr, out.as<__nv_bfloat16>() + 2 * elems, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<Bf16> got = out.download<Bf16>();
    int bad = 0;
    for (const auto [e, slot] : {std::pair{0, 2}, std::pair{2, 1}}) {
      const cpu_reference::MxRows rows{m.f, q.data() + e * bytes, s.data() + e * scale_bytes,
                                       row_bytes, groups};
      std::vector<Bf16> want(m.k);
      for (int r = 0; r < m.rows; ++r) {
        cpu_reference::dequant_row_mx(rows, r, m.k, want.data());
        for (int c = 0; c < m.k && bad < 5; ++c) {
          const Bf16 g = got[slot * elems + static_cast<size_t>(r) * m.k + c];
          if (std::memcmp(&g, &want[c], sizeof(Bf16)) != 0) {
            ADD_FAILURE() << "expert " << e << " row " << r << " col " << c << ": got bits "
                          << g.bits << ", want " << want[c].bits << " (scale "
                          << int(s[e * scale_bytes + r * groups + c / kMxGroup]) << ")";
            ++bad;
          }
        }
      }
    }
    for (size_t i = 0; i < elems; ++i) {
      if (got[i].bits != 0xFFFF) {
        ADD_FAILURE() << "expert 1 (no rows) was widened at element " << i;
        break;
      }
    }
  }
}

}  // namespace
}  // namespace moekit
