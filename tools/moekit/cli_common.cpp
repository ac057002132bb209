#include "cli_common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/random_values.h"
#include "moekit/error.h"

namespace moekit::cli {

int pick_moe_layer(const MoeSpec& spec, int requested) {
  if (requested < 0) return spec.moe_layers.front();
  MK_CHECK(requested < spec.num_layers, "--layer " << requested << " is out of range: '"
                                                   << spec.name << "' has " << spec.num_layers
                                                   << " layers");
  MK_CHECK(spec.is_moe_layer(requested),
           "--layer " << requested << " is a dense layer of '" << spec.name
                      << "'; its first MoE layer is " << spec.moe_layers.front());
  return requested;
}

std::unique_ptr<LayerWeights> load_layer_weights(const MoeSpec& spec, int layer,
                                                 const std::string& weights_dir, uint64_t seed) {
  if (!weights_dir.empty()) return load_checkpoint_weights(spec, layer, weights_dir);
  return make_random_weights(spec, layer, seed);
}

std::vector<Bf16> random_input(const MoeSpec& spec, int tokens, uint64_t seed) {
  namespace rv = random_values;
  const uint64_t stream = rv::stream_key(seed, -1, rv::Tensor::Input, -1);
  std::vector<Bf16> x(static_cast<size_t>(tokens) * spec.hidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(rv::uniform(stream, i));
  return x;
}

std::string human_bytes(double bytes) {
  char buf[64];
  if (bytes >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  else if (bytes >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1f kB", bytes / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  return buf;
}

double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  MK_CHECK(a.size() == b.size(), "expected outputs of equal size, got " << a.size() << " and "
                                                                        << b.size());
  double scale = 0.0, diff = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);  // a NaN anywhere is infinitely off
  }
  return diff / std::max(scale, 1e-30);
}

}  // namespace moekit::cli
