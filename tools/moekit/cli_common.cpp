#include "cli_common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/random_values.h"
#include "common/text_escape.h"
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
                                                 const std::string& weights_dir, uint64_t seed,
                                                 ExpertFormat format) {
  if (!weights_dir.empty()) {
    LoadOptions lo;
    lo.expert_format = format;
    return load_checkpoint_weights(spec, layer, weights_dir, lo);
  }
  return make_random_weights(spec, layer, seed, format);
}

std::vector<Bf16> random_input(const MoeSpec& spec, int tokens, uint64_t seed) {
  namespace rv = random_values;
  const uint64_t stream = rv::stream_key(seed, -1, rv::Tensor::Input, -1);
  std::vector<Bf16> x(static_cast<size_t>(tokens) * spec.hidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(rv::uniform(stream, i));
  return x;
}

CLI::Validator decimal_integer(bool non_negative) {
  return CLI::Validator(
      [non_negative](std::string& s) -> std::string {
        const size_t digits = !non_negative && !s.empty() && s[0] == '-' ? 1 : 0;
        bool ok = s.size() > digits && s.size() <= digits + 19;
        for (size_t i = digits; ok && i < s.size(); ++i) ok = s[i] >= '0' && s[i] <= '9';
        if (ok) return "";
        return "'" + escape_text(s) + "' is not a " +
               (non_negative ? "non-negative " : "") + "decimal integer";
      },
      non_negative ? "UINT" : "INT");
}

void refuse_unused_option(const CLI::App& cmd, const char* option, const std::string& device,
                          const char* works_on) {
  MK_CHECK(cmd.count(option) == 0, cmd.get_name() << ": " << option << " does nothing on --device "
                                                  << device << "; it works on " << works_on);
}

void check_finite_output(const std::vector<float>& y, int hidden, const std::string& what) {
  for (size_t i = 0; i < y.size(); ++i) {
    MK_CHECK(std::isfinite(y[i]), "the output of " << what << " is not finite: y[" << i / hidden
                                                   << ", " << i % hidden << "] = " << y[i]
                                                   << " (check the weights and the config)");
  }
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

// --dtype's format: config = what the spec's quantization_config declares.
ExpertFormat bench_format(const MoeSpec& spec, const std::string& dtype, const char* command) {
  if (dtype != "config") {
    try {
      return parse_expert_format(dtype);
    } catch (const Error&) {
      MK_FAIL(command << ": --dtype '" << dtype
                      << "' is not one of bf16, fp8, mxfp4, mxfp8, config");
    }
  }
  if (spec.fp8_experts()) return ExpertFormat::Fp8Block;
  if (spec.quant.kind == QuantKind::Mxfp4) return ExpertFormat::Mxfp4;
  if (spec.quant.kind == QuantKind::Mxfp8) return ExpertFormat::Mxfp8;
  return ExpertFormat::Bf16;
}

DType gpu_expert_dtype(ExpertFormat f) {
  return f == ExpertFormat::Fp8Block ? DType::F8_E4M3 : DType::BF16;
}

ExpertFormat gpu_mx_format(ExpertFormat f) {
  return f == ExpertFormat::Mxfp4 || f == ExpertFormat::Mxfp8 ? f : ExpertFormat::Bf16;
}

}  // namespace moekit::cli
