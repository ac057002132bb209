// Deterministic random weights for any MoeSpec (make_random_weights).
//
// Every value is a pure function of (seed, layer, tensor, expert, index); the exact formula is
// written down in src/io/random_weight_values.h, which device code includes to regenerate the
// same tensors on the GPU. Router, biases and the shared MLP are generated up front (they are
// small and every forward reads them); routed experts are generated on first expert(e) call and
// fused shared slots are repacked from the shared MLP on first use, so a layer of a 256-expert
// model costs only the experts a forward actually routes to.
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

#include "io/lazy_experts.h"
#include "io/random_weight_values.h"
#include "moekit/error.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

using random_values::stream_key;
using random_values::Tensor;
using random_values::uniform;
using random_values::weight_scale;
using random_values::weight_value;

// rows x cols bf16 tensor, value at index r*cols + c.
void fill_bf16(Bf16* out, size_t count, uint64_t stream, float scale) {
  for (size_t i = 0; i < count; ++i) out[i] = float_to_bf16(weight_value(stream, i, scale));
}

void fill_f32(float* out, size_t count, uint64_t stream, float scale) {
  for (size_t i = 0; i < count; ++i) out[i] = uniform(stream, i) * scale;
}

class RandomLayerWeights final : public LayerWeights {
 public:
  RandomLayerWeights(const MoeSpec& spec, int layer, uint64_t seed)
      : LayerWeights(spec, layer),
        seed_(seed),
        experts_(spec.num_experts + spec.shared_slots(),
                 [this](int e, io::ExpertStorage& out) { build(e, out); }) {
    const size_t H = spec.hidden, E = spec.num_experts;
    const size_t Is = spec.shared_intermediate;

    // Router [router_columns, H]: row E (gated shared expert) continues the same index stream.
    const size_t router_count = static_cast<size_t>(spec.router_columns()) * H;
    const uint64_t router_stream = stream_key(seed, layer, Tensor::RouterWeight, -1);
    const float router_scale = weight_scale(spec.hidden);
    if (spec.router_dtype == DType::F32) {
      router_weight_.resize(router_count * sizeof(float));
      fill_f32(reinterpret_cast<float*>(router_weight_.data()), router_count, router_stream,
               router_scale);
    } else {
      MK_CHECK(spec.router_dtype == DType::BF16,
               "random weights support a BF16 or F32 router, got router_dtype "
                   << dtype_name(spec.router_dtype));
      router_weight_.resize(router_count * sizeof(Bf16));
      fill_bf16(reinterpret_cast<Bf16*>(router_weight_.data()), router_count, router_stream,
                router_scale);
    }
    if (spec.has_correction_bias) {
      correction_bias_.resize(E);
      fill_f32(correction_bias_.data(), E, stream_key(seed, layer, Tensor::CorrectionBias, -1),
               random_values::kCorrectionBiasScale);
    }
    if (spec.has_router_bias) {
      router_bias_.resize(E);
      fill_f32(router_bias_.data(), E, stream_key(seed, layer, Tensor::RouterBias, -1),
               random_values::kBiasScale);
    }
    if (spec.shared_kind != SharedKind::None && Is > 0) {
      shared_w13_.resize(2 * Is * H);
      fill_bf16(shared_w13_.data(), shared_w13_.size(),
                stream_key(seed, layer, Tensor::SharedW13, -1), weight_scale(spec.hidden));
      shared_w2_.resize(H * Is);
      fill_bf16(shared_w2_.data(), shared_w2_.size(), stream_key(seed, layer, Tensor::SharedW2, -1),
                weight_scale(spec.shared_intermediate));
    }
  }

  ExpertView expert(int e) const override { return experts_.get(e); }
  int materialised_experts() const override { return experts_.materialised(); }
  std::string origin() const override {
    std::ostringstream s;
    s << "random seed " << seed_;
    return s.str();
  }
  std::optional<uint64_t> random_seed() const override { return seed_; }

 private:
  void build(int e, io::ExpertStorage& out) const {
    if (e >= spec_.num_experts) {
      io::repack_shared_slot(spec_, shared_w13(), shared_w2(), e - spec_.num_experts, out);
      return;
    }
    const size_t H = spec_.hidden, I = spec_.expert_intermediate;
    out.w13.resize(2 * I * H);
    fill_bf16(out.w13.data(), out.w13.size(), stream_key(seed_, layer_, Tensor::ExpertW13, e),
              weight_scale(spec_.hidden));
    out.w2.resize(H * I);
    fill_bf16(out.w2.data(), out.w2.size(), stream_key(seed_, layer_, Tensor::ExpertW2, e),
              weight_scale(spec_.expert_intermediate));
    if (spec_.has_expert_bias) {
      out.b13.resize(2 * I);
      fill_f32(out.b13.data(), out.b13.size(), stream_key(seed_, layer_, Tensor::ExpertB13, e),
               random_values::kBiasScale);
      out.b2.resize(H);
      fill_f32(out.b2.data(), out.b2.size(), stream_key(seed_, layer_, Tensor::ExpertB2, e),
               random_values::kBiasScale);
    }
    out.view_owned();
  }

  uint64_t seed_;
  io::LazyExperts experts_;
};

}  // namespace

std::unique_ptr<LayerWeights> make_random_weights(const MoeSpec& spec, int layer, uint64_t seed) {
  MK_CHECK(spec.hidden > 0 && spec.num_experts > 0 && spec.expert_intermediate > 0,
           "spec " << spec.name << " has an empty MoE block: hidden " << spec.hidden << ", experts "
                   << spec.num_experts << ", intermediate " << spec.expert_intermediate);
  MK_CHECK(spec.is_moe_layer(layer),
           "layer " << layer << " of " << spec.name << " is not an MoE layer");
  return std::make_unique<RandomLayerWeights>(spec, layer, seed);
}

}  // namespace moekit
