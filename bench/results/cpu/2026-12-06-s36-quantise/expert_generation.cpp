#include <chrono>
#include <cstdio>

#include "moekit/spec.h"
#include "moekit/weights.h"
using namespace moekit;
int main() {
  for (auto [m, f] :
       {std::pair{"deepseek-v3", ExpertFormat::Fp8Block},
        std::pair{"deepseek-v3", ExpertFormat::Bf16}, std::pair{"minimax-m3", ExpertFormat::Mxfp8},
        std::pair{"gpt-oss-120b", ExpertFormat::Mxfp4}}) {
    const MoeSpec spec = load_spec(m);
    auto w = make_random_weights(spec, spec.moe_layers.front(), 1, f);
    auto t0 = std::chrono::steady_clock::now();
    for (int e = 0; e < 2; ++e) w->expert(e);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 2;
    printf("%-14s %-6s %.3f s an expert (one thread)\n", m, expert_format_name(f), dt);
  }
}
