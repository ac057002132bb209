// The AVX-512 MXFP4 row kernels of the tree, fp32 and bf16 activations, without and with VBMI-made
// indices, on gpt-oss rows of 2880 columns: 48 rows (in cache) and 40000 (from DRAM), 1 and 2
// tokens, one thread, the best of many calls, ns per 32 weights. Built against build/libmoekit.a:
// g++ -O2 -std=c++20 -Isrc -Iinclude mxfp4_rows_ab.cpp build/libmoekit.a -o mxfp4_rows_ab -lpthread
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "cpu/fast/kernels.h"

using namespace moekit;
using namespace moekit::cpu_fast::detail;

template <class X, class F>
void compare(const char* what, int rows, const std::vector<uint8_t>& q,
             const std::vector<uint8_t>& s, const X* const* x, F base, F vbmi) {
  const int k = 2880;
  std::vector<float> out(2 * rows);
  for (int n : {1, 2}) {
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep < (rows < 100 ? 4000 : 30); ++rep)
      for (int v = 0; v < 2; ++v) {
        const auto t0 = std::chrono::steady_clock::now();
        (v ? vbmi : base)(q.data(), k / 2, s.data(), k / 32, rows, k, x, n, out.data(), rows);
        best[v] = std::min(
            best[v], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    const double w = double(rows) * k;
    std::printf("%s rows %d n %d: avx512 %.3f ns/32w, vbmi %.3f ns/32w, ratio %.3f\n", what, rows,
                n, best[0] / w * 32e9, best[1] / w * 32e9, best[1] / best[0]);
  }
}

int main() {
  const int k = 2880;
  for (int rows : {48, 40000}) {
    std::vector<uint8_t> q(size_t(rows) * k / 2), s(size_t(rows) * k / 32);
    for (size_t i = 0; i < q.size(); ++i) q[i] = (i * 2654435761u) >> 13;
    for (size_t i = 0; i < s.size(); ++i) s[i] = 100 + (i * 7) % 50;
    std::vector<float> f0(k), f1(k);
    std::vector<Bf16> b0(k), b1(k);
    for (int c = 0; c < k; ++c) {
      b0[c] = b1[c] = float_to_bf16(0.01f * (c % 97));
      f0[c] = f1[c] = bf16_to_float(b0[c]);
    }
    const float* xf[2] = {f0.data(), f1.data()};
    const Bf16* xb[2] = {b0.data(), b1.data()};
    compare("fp32", rows, q, s, xf, dot_rows_mxfp4_f32_avx512, dot_rows_mxfp4_f32_avx512vbmi);
    compare("bf16", rows, q, s, xb, dot_rows_mxfp4_bf16_avx512, dot_rows_mxfp4_bf16_avx512vbmi);
  }
}
