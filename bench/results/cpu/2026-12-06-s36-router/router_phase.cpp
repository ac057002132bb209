// The fast router's phase at one token: its time with 1 and 2 threads, each call after the caches
// were flushed (a 512 MB read), median of 15; and the pool's round trip for an empty phase.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "cpu/fast/thread_pool.h"
#include "moekit/cpu_fast.h"
#include "moekit/spec.h"
#include "moekit/weights.h"
using namespace moekit;
static std::vector<float> flush_buf(128u << 20);
static volatile float sink;
void flush() {
  float s = 0;
  for (size_t i = 0; i < flush_buf.size(); i += 16) s += flush_buf[i];
  sink = s;
}
int main(int argc, char** argv) {
  for (const char* m : {"deepseek-v3", "kimi-k2", "minimax-m2", "minimax-m3", "gpt-oss-120b",
                        "qwen3-30b-a3b", "mixtral-8x7b"}) {
    const MoeSpec spec = load_spec(m);
    auto w = make_random_weights(spec, spec.moe_layers.front(), 1);
    std::vector<Bf16> x(spec.hidden);
    for (int i = 0; i < spec.hidden; ++i) x[i] = float_to_bf16(0.01f * (i % 17));
    printf("%-14s C %3d H %5d MACs %.2fM:", m, spec.router_columns(), spec.hidden,
           spec.router_columns() * double(spec.hidden) / 1e6);
    for (int threads : {1, 2}) {
      cpu_fast::FastOptions opt;
      opt.threads = threads;
      std::vector<double> t;
      for (int r = 0; r < 15; ++r) {
        flush();
        auto t0 = std::chrono::steady_clock::now();
        auto l = cpu_fast::router_logits(*w, x.data(), 1, opt);
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() *
                    1e6);
      }
      std::sort(t.begin(), t.end());
      printf("  %d thr %7.1f us", threads, t[t.size() / 2]);
    }
    printf("\n");
  }
  std::vector<double> t;
  for (int r = 0; r < 200; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    cpu_fast::detail::global_pool().run(2, [](int, int) {});
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e6);
  }
  std::sort(t.begin(), t.end());
  printf("pool round trip, 2 participants, empty: median %.1f us, p90 %.1f us\n", t[100], t[180]);
}
