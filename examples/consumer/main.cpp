// Runs one DeepSeek-V2-Lite-shaped (by default) MoE layer (random weights) through the CPU reference, fused and
// unfused, and prints how far apart they are: the smallest useful program against moekit.
#include <cmath>
#include <cstdio>
#include <vector>

#include "moekit/layer.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

int main(int argc, char** argv) {
  const char* model = argc > 1 ? argv[1] : "deepseek-v2-lite";
  const moekit::MoeSpec spec = moekit::load_spec(model);
  const auto weights = moekit::make_random_weights(spec, spec.moe_layers.front(), /*seed=*/1);
  const int tokens = 2;
  std::vector<moekit::Bf16> x(static_cast<size_t>(tokens) * spec.hidden);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = moekit::float_to_bf16(std::sin(0.37f * static_cast<float>(i)));
  const auto on = moekit::cpu_reference::forward(*weights, x.data(), tokens,
                                                 moekit::FuseShared::Auto);
  const auto off = moekit::cpu_reference::forward(*weights, x.data(), tokens,
                                                  moekit::FuseShared::Off);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < on.y.size(); ++i) {
    diff = std::fmax(diff, std::fabs(on.y[i] - off.y[i]));
    scale = std::fmax(scale, std::fabs(off.y[i]));
  }
  std::printf("%s: token 0 -> expert %d first; fused vs unfused max rel diff %.3g\n",
              spec.name.c_str(), on.routing.ids[0], diff / scale);
  return 0;
}
