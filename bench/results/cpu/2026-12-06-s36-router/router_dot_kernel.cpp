// One core's router_dot at one token on DeepSeek-V3's (bf16, 256 x 7168) and MiniMax-M2's (fp32,
// 256 x 3072) router shapes, from DRAM (64 distinct matrices in turn), AVX-512 and AVX2 tables;
// the best of 3 passes; a checksum of the logits' bits.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/fast/kernels.h"
using namespace moekit::cpu_fast::detail;
int main() {
  struct Case {
    int H, C;
    bool f32;
    const char* name;
  };
  for (const Case cs :
       {Case{7168, 256, false, "deepseek-v3 bf16"}, Case{3072, 256, true, "minimax-m2 fp32"}}) {
    const int sets = 64, elem = cs.f32 ? 4 : 2;
    std::mt19937 rng(1);
    std::vector<uint8_t> w(static_cast<size_t>(sets) * cs.C * cs.H * elem);
    if (cs.f32) {
      float* f = reinterpret_cast<float*>(w.data());
      for (size_t i = 0; i < w.size() / 4; ++i) f[i] = (int(rng() % 2001) - 1000) * 1e-4f;
    } else {
      uint16_t* b = reinterpret_cast<uint16_t*>(w.data());
      for (size_t i = 0; i < w.size() / 2; ++i) b[i] = 0x3c00 + rng() % 512 + ((rng() & 1) << 15);
    }
    std::vector<double> x(cs.H), out(cs.C);
    for (auto& v : x) v = (int(rng() % 200) - 100) / 100.0;
    const double* xp = x.data();
    for (const Kernels* K : {&avx512_kernels(), &avx2_kernels()}) {
      double best = 1e9;
      uint64_t sum = 0;
      for (int rep = 0; rep < 3; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        for (int s = 0; s < sets; ++s)
          K->router_dot(w.data() + static_cast<size_t>(s) * cs.C * cs.H * elem, cs.f32, cs.H, cs.C,
                        cs.H, &xp, 1, out.data(), cs.C);
        best = std::min(
            best,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / sets);
      }
      for (double v : out) {
        uint64_t b;
        memcpy(&b, &v, 8);
        sum = sum * 31 + b;
      }
      printf("%-18s %-7s %7.1f us  checksum %016llx\n", cs.name, K->name, best * 1e6,
             (unsigned long long)sum);
    }
  }
}
