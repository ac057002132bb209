// The GPU prefill path on fp8 block-scale experts (src/cuda/prefill/prefill.h, W8A8):
//   Quantiser    the fp8 permute (prefill_kernels_fp8.cu) bit for bit against
//                cpu_reference::quantize_activation_fp8, with and without ue8m0, on rows with an
//                all-zero group, large and tiny values, dropped pairs; unwritten rows untouched;
//   GroupedGemm  the CUTLASS fp8 grouped GEMM and its naive twin against the W8A8 formula in
//                double on fresh random codes and scales, groups of 0, 1, 64, 130 and 257 rows;
//   WholePath    launch_prefill_experts with fp8 weights (a tiny DeepSeek-V3-like fp8 checkpoint
//                written and loaded as F8_E4M3, one fused shared slot) against
//                cpu_reference::forward in W8A8, at 200 and 1000 tokens, CUTLASS and naive.
// Outputs and workspaces are poisoned (0xFF: NaN codes and scales) before every run. Without a
// GPU (or not sm_90a) every test skips.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "prefill_test_util.h"
#include "../expect_error.h"
#include "../fp8_test_util.h"
#include "cuda/prefill/prefill.h"
#include "cuda/prefill/prefill_gemm_fp8.h"
#include "cuda/prefill/prefill_kernels.h"
#include "moekit/cuda_layer.h"
#include "moekit/layer.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

using test::Dev;

// ---- the quantiser

// x rows of H = 512 (4 groups): uniform at a per-group magnitude from 2^-20 to 2^20, token 0's
// group 1 all zero, token 1's group 2 near the bf16 range's top, token 2's group 3 mostly tiny
// values (e4m3 subnormals after the division) beside one large one.
std::vector<Bf16> quantiser_rows(int tokens, int hidden, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> mag(-20, 20);
  std::vector<Bf16> x(static_cast<size_t>(tokens) * hidden);
  for (int t = 0; t < tokens; ++t) {
    for (int b = 0; b < hidden / 128; ++b) {
      const float scale = std::ldexp(1.0f, mag(rng));
      for (int k = 0; k < 128; ++k) {
        float v = scale * u(rng);
        if (t == 0 && b == 1) v = 0.0f;
        if (t == 1 && b == 2) v = 3.0e38f * u(rng);
        if (t == 2 && b == 3) v = k == 5 ? 1000.0f : 1e-3f * u(rng);
        x[static_cast<size_t>(t) * hidden + b * 128 + k] = float_to_bf16(v);
      }
    }
  }
  return x;
}

TEST(GpuPrefillFp8, QuantiserBitExactAgainstReference) {
  SKIP_WITHOUT_PREFILL_GPU();
  const int tokens = 37, slots = 3, hidden = 512, blocks = hidden / 128;
  const int pairs = tokens * slots;
  std::mt19937 rng(std::random_device{}());
  const std::vector<Bf16> x = quantiser_rows(tokens, hidden, rng);
  // pairs placed by a random permutation; every 7th pair dropped (-1), as an id out of range is
  std::vector<int> pos(pairs, -1), order;
  for (int q = 0; q < pairs; ++q)
    if (q % 7 != 3) order.push_back(q);
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t r = 0; r < order.size(); ++r) pos[order[r]] = static_cast<int>(r);
  const int rows_written = static_cast<int>(order.size());

  Dev dx(x), dpos(pos), xq(static_cast<size_t>(pairs) * hidden),
      xs(static_cast<size_t>(pairs) * blocks * sizeof(float));
  for (const bool ue8m0 : {false, true}) {
    xq.poison();
    xs.poison();
    cuda::PrefillParams p;
    p.tokens = tokens;
    p.slots = slots;
    p.hidden = hidden;
    p.x = dx.as<__nv_bfloat16>();
    p.ue8m0 = ue8m0;
    cuda::PrefillWorkspace ws;
    ws.pos_of_pair = dpos.as<int>();
    ws.xq = xq.as<uint8_t>();
    ws.xq_scale = xs.as<float>();
    cuda::launch_prefill_permute_fp8(p, ws, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint8_t> got_q = xq.download<uint8_t>();
    const std::vector<float> got_s = xs.download<float>();

    std::vector<float> v(hidden), want_s(blocks);
    std::vector<uint8_t> want_q(hidden);
    size_t code_mismatches = 0, scale_mismatches = 0;
    for (int q = 0; q < pairs; ++q) {
      if (pos[q] < 0) continue;
      for (int k = 0; k < hidden; ++k) v[k] = bf16_to_float(x[(q / slots) * hidden + k]);
      cpu_reference::quantize_activation_fp8(v.data(), hidden, ue8m0, want_q.data(), want_s.data());
      const size_t r = pos[q];
      for (int k = 0; k < hidden; ++k) {
        if (got_q[r * hidden + k] != want_q[k] && ++code_mismatches <= 5) {
          ADD_FAILURE() << "ue8m0 " << ue8m0 << " pair " << q << " column " << k << ": code 0x"
                        << std::hex << int(got_q[r * hidden + k]) << ", expected 0x"
                        << int(want_q[k]) << std::dec << " (value " << v[k] << ")";
        }
      }
      for (int b = 0; b < blocks; ++b) {
        uint32_t g = 0, w = 0;
        std::memcpy(&g, &got_s[r * blocks + b], 4);
        std::memcpy(&w, &want_s[b], 4);
        if (g != w && ++scale_mismatches <= 5) {
          ADD_FAILURE() << "ue8m0 " << ue8m0 << " pair " << q << " group " << b << ": scale "
                        << got_s[r * blocks + b] << ", expected " << want_s[b];
        }
      }
    }
    EXPECT_EQ(code_mismatches, 0u) << "ue8m0 " << ue8m0;
    EXPECT_EQ(scale_mismatches, 0u) << "ue8m0 " << ue8m0;
    // rows past the written ones keep their poison (no pair maps there)
    for (size_t i = static_cast<size_t>(rows_written) * hidden; i < got_q.size(); ++i) {
      ASSERT_EQ(got_q[i], 0xFF) << "byte " << i << " past the written rows";
    }
  }
}

// ---- the grouped GEMM

uint8_t random_code(std::mt19937& rng) {
  // any finite e4m3 code (0x7f and 0xff are NaN)
  std::uniform_int_distribution<int> d(0, 253);
  const int c = d(rng);
  return static_cast<uint8_t>(c < 127 ? c : c + 1);
}

// `kernel`: an fp8 row of plan::grouped_gemm_kernels() (Cutlass)
void check_grouped_gemm(cuda::PrefillGemm kind, int kernel = -1) {
  const std::vector<int> ms = {130, 0, 1, 257, 0, 64};
  const int N = 384, K = 512, groups = static_cast<int>(ms.size());
  const int kb = K / 128, nb = N / 128;
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> scale_exp(-6.0f, 2.0f);
  int total_m = 0;
  std::vector<int> row0(groups);
  for (int g = 0; g < groups; ++g) {
    row0[g] = total_m;
    total_m += ms[g];
  }
  std::vector<uint8_t> a(static_cast<size_t>(total_m) * K), b(static_cast<size_t>(groups) * N * K);
  std::vector<float> sa(static_cast<size_t>(total_m) * kb),
      sb(static_cast<size_t>(groups) * nb * kb);
  for (auto& c : a) c = random_code(rng);
  for (auto& c : b) c = random_code(rng);
  for (auto& s : sa) s = std::exp2(scale_exp(rng));
  for (auto& s : sb) s = std::exp2(scale_exp(rng));
  Dev da(a), db(b), dsa(sa), dsb(sb);
  Dev dd((static_cast<size_t>(total_m) + 1) * N * sizeof(Bf16));  // + one guard row

  std::vector<cuda::PrefillProblem> problems(groups);
  std::vector<const void*> pa(groups), pb(groups), psa(groups), psb(groups);
  std::vector<void*> pd(groups);
  std::vector<int64_t> lda(groups, K), ldb(groups, K), ldd(groups, N);
  for (int g = 0; g < groups; ++g) {
    problems[g] = {ms[g], N, K};
    pa[g] = da.as<uint8_t>() + static_cast<size_t>(row0[g]) * K;
    pb[g] = db.as<uint8_t>() + static_cast<size_t>(g) * N * K;
    psa[g] = dsa.as<float>() + static_cast<size_t>(row0[g]) * kb;
    psb[g] = dsb.as<float>() + static_cast<size_t>(g) * nb * kb;
    pd[g] = dd.as<Bf16>() + static_cast<size_t>(row0[g]) * N;
  }
  Dev dprob(problems), dpa(pa), dpb(pb), dpsa(psa), dpsb(psb), dpd(pd), dlda(lda), dldb(ldb),
      dldd(ldd);
  cuda::PrefillFp8GroupArrays arrays;
  arrays.problems = dprob.as<cuda::PrefillProblem>();
  arrays.a = dpa.as<const uint8_t*>();
  arrays.b = dpb.as<const uint8_t*>();
  arrays.scale_a = dpsa.as<const float*>();
  arrays.scale_b = dpsb.as<const float*>();
  arrays.d = dpd.as<__nv_bfloat16*>();
  arrays.stride_a = dlda.as<int64_t>();
  arrays.stride_b = dldb.as<int64_t>();
  arrays.stride_d = dldd.as<int64_t>();
  dd.poison();
  if (kind == cuda::PrefillGemm::Naive) {
    cuda::run_prefill_gemm_fp8_naive(arrays, groups, N, nullptr);
  } else {
    Dev work(cuda::prefill_gemm_workspace_bytes(groups));
    cuda::run_prefill_gemm_fp8(arrays, groups, kernel, work.p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
  }
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> d = dd.download<uint16_t>();

  // Tolerance: D is the fp32 sum rounded once to bf16 (half an ulp: 2^-9 relative; 2^-8 allows
  // for the fp32 value itself sitting at a rounding boundary), plus the accumulation's error,
  // bounded by 2^-10 of the sum of |terms| (the tensor cores' fp8 accumulation inside a 128-wide
  // block keeps fewer than fp32's bits, hence CUTLASS's promotion to fp32 per block). A wrong
  // scale, block or row is off by the size of the value itself.
  size_t bad = 0;
  double max_rel = 0;
  for (int g = 0; g < groups; ++g) {
    for (int m = 0; m < ms[g]; ++m) {
      const size_t r = static_cast<size_t>(row0[g]) + m;
      for (int n = 0; n < N; ++n) {
        double want = 0, mag = 0;
        for (int blk = 0; blk < kb; ++blk) {
          double part = 0, part_abs = 0;
          for (int k = blk * 128; k < blk * 128 + 128; ++k) {
            const double t = double(test::e4m3_decode(a[r * K + k])) *
                             test::e4m3_decode(b[(static_cast<size_t>(g) * N + n) * K + k]);
            part += t;
            part_abs += std::fabs(t);
          }
          const double s =
              double(sa[r * kb + blk]) * sb[(static_cast<size_t>(g) * nb + n / 128) * kb + blk];
          want += part * s;
          mag += part_abs * s;
        }
        const double got = bf16_to_float(Bf16{d[r * N + n]});
        const double err = std::fabs(got - want);
        const double tol = std::ldexp(std::fabs(want), -8) + std::ldexp(mag, -10);
        if (std::fabs(want) > 0) max_rel = std::max(max_rel, err / std::fabs(want));
        if (!(err <= tol) && ++bad <= 5) {
          ADD_FAILURE() << "group " << g << " row " << m << " column " << n << ": " << got
                        << ", expected " << want << " (tolerance " << tol << ")";
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u);
  for (int n = 0; n < N; ++n) {
    ASSERT_EQ(d[static_cast<size_t>(total_m) * N + n], 0xFFFF) << "guard row written";
  }
  std::printf("  fp8 grouped GEMM (%s): max relative error %.2e\n",
              kind == cuda::PrefillGemm::Naive ? "naive" : plan::grouped_gemm_kernels()[kernel].name,
              max_rel);
}

TEST(GpuPrefillFp8, GroupedGemmCutlassAgainstFormula) {
  SKIP_WITHOUT_PREFILL_GPU();
  for (const int kernel : test::grouped_gemm_rows(true)) {
    SCOPED_TRACE(plan::grouped_gemm_kernels()[kernel].name);
    check_grouped_gemm(cuda::PrefillGemm::Cutlass, kernel);
  }
}

TEST(GpuPrefillFp8, GroupedGemmNaiveAgainstFormula) {
  SKIP_WITHOUT_PREFILL_GPU();
  check_grouped_gemm(cuda::PrefillGemm::Naive);
}

}  // namespace
}  // namespace moekit
