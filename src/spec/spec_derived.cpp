// What a MoeSpec's fields imply (moekit/spec.h): the names of its enums, the fused shared slots,
// which layers are MoE, and the bytes of its weights in each expert format.
#include <algorithm>
#include <cstddef>

#include "moekit/expert_format.h"
#include "moekit/spec.h"

namespace moekit {

const char* scoring_name(Scoring s) {
  switch (s) {
    case Scoring::Softmax:
      return "softmax";
    case Scoring::Sigmoid:
      return "sigmoid";
    case Scoring::SqrtSoftplus:
      return "sqrtsoftplus";
    case Scoring::SoftmaxOfTopk:
      return "softmax-of-topk";
  }
  return "?";
}

const char* shared_kind_name(SharedKind k) {
  switch (k) {
    case SharedKind::None:
      return "none";
    case SharedKind::Plain:
      return "plain";
    case SharedKind::Gated:
      return "gated";
  }
  return "?";
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::Silu:
      return "silu";
    case Activation::SwigluOaiInterleaved:
      return "swiglu-oai-interleaved";
    case Activation::SwigluOai:
      return "swigluoai";
  }
  return "?";
}

int MoeSpec::shared_slots() const {
  if (shared_kind == SharedKind::None || shared_intermediate <= 0 || expert_intermediate <= 0)
    return 0;
  return shared_intermediate % expert_intermediate == 0 ? shared_intermediate / expert_intermediate
                                                        : 0;
}

bool MoeSpec::is_moe_layer(int layer) const {
  return std::binary_search(moe_layers.begin(), moe_layers.end(), layer);
}

size_t MoeSpec::expert_bytes() const {
  return size_t{3} * static_cast<size_t>(expert_intermediate) * static_cast<size_t>(hidden) * 2;
}
size_t MoeSpec::shared_bytes() const {
  return size_t{3} * static_cast<size_t>(shared_intermediate) * static_cast<size_t>(hidden) * 2;
}
// gate [I, H] and up [I, H] tiled separately, down [H, I]: scales of ceil(rows/128) x
// ceil(cols/128) tiles each.
static size_t fp8_mlp_bytes(size_t width, size_t hidden) {
  const auto tiles = [](size_t n) { return (n + 127) / 128; };
  const size_t scales = 2 * tiles(width) * tiles(hidden) + tiles(hidden) * tiles(width);
  return 3 * width * hidden + 4 * scales;
}
size_t MoeSpec::fp8_expert_bytes() const {
  return fp8_mlp_bytes(static_cast<size_t>(expert_intermediate), static_cast<size_t>(hidden));
}
size_t MoeSpec::fp8_shared_bytes() const {
  return shared_intermediate > 0 ? fp8_mlp_bytes(static_cast<size_t>(shared_intermediate),
                                                 static_cast<size_t>(hidden))
                                 : 0;
}
// The MX byte counts of an MLP of `width` in the config's MX format (0 for other configs).
static size_t spec_mx_mlp_bytes(QuantKind kind, size_t width, size_t hidden) {
  if (kind == QuantKind::Mxfp4) return mx_mlp_bytes(ExpertFormat::Mxfp4, width, hidden);
  if (kind == QuantKind::Mxfp8) return mx_mlp_bytes(ExpertFormat::Mxfp8, width, hidden);
  return 0;
}
size_t MoeSpec::mx_expert_bytes() const {
  return spec_mx_mlp_bytes(quant.kind, static_cast<size_t>(expert_intermediate),
                           static_cast<size_t>(hidden));
}
size_t MoeSpec::mx_shared_bytes() const {
  return spec_mx_mlp_bytes(quant.kind, static_cast<size_t>(shared_intermediate),
                           static_cast<size_t>(hidden));
}
size_t MoeSpec::router_bytes() const {
  return static_cast<size_t>(router_columns()) * static_cast<size_t>(hidden) *
         dtype_size(router_dtype);
}

}  // namespace moekit
