// The pool's round trip for an empty phase of 2 participants: back to back, and after 1 ms idle.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
#include "cpu/fast/thread_pool.h"
using clk = std::chrono::steady_clock;
int main() {
  auto& pool = moekit::cpu_fast::detail::global_pool();
  for (int gap_us : {0, 50, 1000}) {
    std::vector<double> t;
    for (int r = 0; r < 400; ++r) {
      if (gap_us) { auto e = clk::now() + std::chrono::microseconds(gap_us); while (clk::now() < e) {} }
      auto t0 = clk::now();
      pool.run(2, [](int, int) {});
      t.push_back(std::chrono::duration<double>(clk::now() - t0).count() * 1e6);
    }
    std::sort(t.begin(), t.end());
    printf("gap %4d us: round trip median %6.1f us, p90 %6.1f us\n", gap_us, t[200], t[360]);
  }
}
