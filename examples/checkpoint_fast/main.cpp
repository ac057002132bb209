// Loads one MoE layer of a checkpoint (*.safetensors, with or without an index) into the fast CPU
// backend and runs a few tokens through it, checking the result against the CPU reference:
//   moekit_checkpoint_fast <config.json | model dir | short name> <checkpoint dir> [layer] [tokens]
// With a model directory that holds config.json and the checkpoint, pass it twice.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "moekit/cpu_fast.h"
#include "moekit/layer.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: %s <config.json | model dir | name> <checkpoint dir> [layer] [tokens]\n",
                 argv[0]);
    return 2;
  }
  try {
    const moekit::MoeSpec spec = moekit::load_spec(argv[1]);
    const int layer = argc > 3 ? std::atoi(argv[3]) : spec.moe_layers.front();
    const int tokens = argc > 4 ? std::atoi(argv[4]) : 4;
    // Headers are read now; an expert's weights are read from the mapped files when a token is
    // first routed to it.
    const auto weights = moekit::load_checkpoint_weights(spec, layer, argv[2]);

    std::vector<moekit::Bf16> x(static_cast<size_t>(tokens) * spec.hidden);
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = moekit::float_to_bf16(std::sin(0.37f * static_cast<float>(i)));
    const moekit::ForwardResult fast =
        moekit::cpu_fast::forward(*weights, x.data(), tokens, moekit::FuseShared::Auto);
    const moekit::ForwardResult ref =
        moekit::cpu_reference::forward(*weights, x.data(), tokens, moekit::FuseShared::Auto);

    double diff = 0, scale = 0;
    for (size_t i = 0; i < ref.y.size(); ++i) {
      diff = std::fmax(diff, std::fabs(fast.y[i] - ref.y[i]));
      scale = std::fmax(scale, std::fabs(ref.y[i]));
    }
    std::printf(
        "%s layer %d (%s): %d tokens on the fast CPU backend (%s)\n", spec.name.c_str(), layer,
        weights->origin().c_str(), tokens,
        moekit::cpu_fast::isa_name(moekit::cpu_fast::resolve_isa(moekit::cpu_fast::Isa::Auto)));
    for (int t = 0; t < tokens; ++t) {
      std::printf("token %d experts:", t);
      for (int s = 0; s < spec.top_k; ++s)
        std::printf(" %d", fast.routing.ids[static_cast<size_t>(t) * fast.routing.slots + s]);
      std::printf("\n");
    }
    const bool same_experts = fast.routing.ids == ref.routing.ids;
    std::printf("fast vs reference: max rel diff %.3g, same experts: %s\n",
                scale > 0 ? diff / scale : diff, same_experts ? "yes" : "no");
    return same_experts && diff <= 2e-5 * scale ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
