// The AVX-512 MXFP4 bf16 row kernels of the tree (vpermw indices against VBMI-made ones) on gpt-oss
// rows of 2880 columns, 48 rows (in cache) and 40000 (from DRAM), 1 and 2 tokens, one thread: the
// best of many calls, ns per 32 weights. Built against build/libmoekit.a:
// g++ -O2 -std=c++20 -Isrc -Iinclude mxfp4_rows_ab.cpp build/libmoekit.a -o mxfp4_rows_ab -lpthread
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <algorithm>
#include "cpu/fast/kernels.h"
using namespace moekit; using namespace moekit::cpu_fast::detail;
int main(int argc, char** argv) {
  const int k = 2880; const size_t ldq = k / 2, lds = k / 32;
  for (int rows : {48, 40000}) {
    std::vector<uint8_t> q(rows * ldq), s(rows * lds);
    for (size_t i = 0; i < q.size(); ++i) q[i] = (i * 2654435761u) >> 13;
    for (size_t i = 0; i < s.size(); ++i) s[i] = 100 + (i * 7) % 50;
    std::vector<Bf16> x0(k), x1(k);
    for (int c = 0; c < k; ++c) { x0[c] = float_to_bf16(0.01f * (c % 97)); x1[c] = x0[c]; }
    const Bf16* xb[2] = {x0.data(), x1.data()};
    std::vector<float> out(2 * rows);
    Kernels::MxRowsBf16 f[2] = {dot_rows_mxfp4_bf16_avx512, dot_rows_mxfp4_bf16_avx512vbmi};
    for (int n : {1, 2}) {
      double best[2] = {1e30, 1e30};
      for (int rep = 0; rep < (rows < 100 ? 4000 : 30); ++rep)
        for (int v = 0; v < 2; ++v) {
          auto t0 = std::chrono::steady_clock::now();
          f[v](q.data(), ldq, s.data(), lds, rows, k, xb, n, out.data(), rows);
          double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          best[v] = std::min(best[v], dt);
        }
      double w = double(rows) * k;
      printf("rows %d n %d: vpermw %.3f ns/32w, vbmi %.3f ns/32w, ratio %.3f\n", rows, n,
             best[0] / w * 32 * 1e9, best[1] / w * 32 * 1e9, best[1] / best[0]);
    }
  }
}
