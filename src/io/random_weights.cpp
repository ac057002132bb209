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
#include <vector>

#include "io/fp8_experts.h"
#include "io/lazy_experts.h"
#include "io/mx_experts.h"
#include "io/random_weight_values.h"
#include "io/tensor_convert.h"
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

// An MLP's bf16 w13 [2W, H] (gate rows, then up rows) and w2 [H, W] in a quantised format, into
// out's fp8 or MX fields: fp8 tiles gate and up separately (as the checkpoints store them), MX
// quantises each row.
void quantise_mlp(ExpertFormat f, bool pow2, const Bf16* w13, const Bf16* w2, size_t width,
                  size_t hidden, io::ExpertStorage& out) {
  using io::ceil_div;
  const size_t W = width, H = hidden;
  if (f == ExpertFormat::Fp8Block) {
    const size_t half_tiles = ceil_div(W, kFp8Tile) * ceil_div(H, kFp8Tile);
    out.w13_fp8.resize(2 * W * H);
    out.w13_scale.resize(2 * half_tiles);
    for (size_t h = 0; h < 2; ++h) {
      io::quantize_fp8_block(w13 + h * W * H, W, H, out.w13_fp8.data() + h * W * H,
                             out.w13_scale.data() + h * half_tiles, pow2);
    }
    out.w2_fp8.resize(H * W);
    out.w2_scale.resize(ceil_div(H, kFp8Tile) * ceil_div(W, kFp8Tile));
    io::quantize_fp8_block(w2, H, W, out.w2_fp8.data(), out.w2_scale.data(), pow2);
    return;
  }
  auto rows = [f](const Bf16* src, size_t n, size_t cols, std::vector<uint8_t>& q,
                  std::vector<uint8_t>& scale) {
    const size_t qb = mx_row_bytes(f, cols), sb = cols / kMxGroup;
    q.resize(n * qb);
    scale.resize(n * sb);
    for (size_t r = 0; r < n; ++r) {
      io::mx_quantize_row(f, src + r * cols, cols, q.data() + r * qb, scale.data() + r * sb);
    }
  };
  rows(w13, 2 * W, H, out.w13_mx, out.w13_mx_scale);
  rows(w2, H, W, out.w2_mx, out.w2_mx_scale);
  out.view.mx_format = f;
}

class RandomLayerWeights final : public LayerWeights {
 public:
  RandomLayerWeights(const MoeSpec& spec, int layer, uint64_t seed, ExpertFormat format)
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
    expert_format_ = format;
    if (format != ExpertFormat::Bf16 && !shared_w13_.empty()) {
      io::ExpertStorage q;
      quantise_mlp(format, spec.quant.scale_ue8m0, shared_w13_.data(), shared_w2_.data(), Is, H,
                   q);
      shared_w13_fp8_ = std::move(q.w13_fp8);
      shared_w13_scale_ = std::move(q.w13_scale);
      shared_w2_fp8_ = std::move(q.w2_fp8);
      shared_w2_scale_ = std::move(q.w2_scale);
      shared_w13_mx_ = std::move(q.w13_mx);
      shared_w13_mx_scale_ = std::move(q.w13_mx_scale);
      shared_w2_mx_ = std::move(q.w2_mx);
      shared_w2_mx_scale_ = std::move(q.w2_mx_scale);
      // (the bf16 pointers are null unless the format is Bf16; swap frees the capacity too)
      std::vector<Bf16>().swap(shared_w13_);
      std::vector<Bf16>().swap(shared_w2_);
    }
  }

  ExpertView expert(int e) const override { return experts_.get(e); }
  int materialised_experts() const override { return experts_.materialised(); }
  std::string origin() const override {
    std::ostringstream s;
    s << "random seed " << seed_;
    return s.str();
  }
  // (the GPU regenerates the bf16 form from the seed; a quantised form has no such path)
  std::optional<uint64_t> random_seed() const override {
    return expert_format_ == ExpertFormat::Bf16 ? std::optional<uint64_t>(seed_) : std::nullopt;
  }

 private:
  void build(int e, io::ExpertStorage& out) const {
    if (e >= spec_.num_experts) {
      const int slot = e - spec_.num_experts;
      if (expert_format_ == ExpertFormat::Fp8Block) {
        io::repack_shared_slot_fp8(spec_, *this, slot, out);
      } else if (expert_format_ != ExpertFormat::Bf16) {
        io::repack_shared_slot_mx(spec_, *this, slot, out);
      } else {
        io::repack_shared_slot(spec_, shared_w13(), shared_w2(), slot, out);
      }
      return;
    }
    const size_t H = spec_.hidden, I = spec_.expert_intermediate;
    // a quantised form keeps only its own bytes: the bf16 values are a temporary
    std::vector<Bf16> w13(2 * I * H), w2(H * I);
    fill_bf16(w13.data(), w13.size(), stream_key(seed_, layer_, Tensor::ExpertW13, e),
              weight_scale(spec_.hidden));
    fill_bf16(w2.data(), w2.size(), stream_key(seed_, layer_, Tensor::ExpertW2, e),
              weight_scale(spec_.expert_intermediate));
    if (expert_format_ == ExpertFormat::Bf16) {
      out.w13 = std::move(w13);
      out.w2 = std::move(w2);
    } else {
      quantise_mlp(expert_format_, spec_.quant.scale_ue8m0, w13.data(), w2.data(), I, H, out);
    }
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

std::unique_ptr<LayerWeights> make_random_weights(const MoeSpec& spec, int layer, uint64_t seed,
                                                  ExpertFormat format) {
  MK_CHECK(spec.hidden > 0 && spec.num_experts > 0 && spec.expert_intermediate > 0,
           "spec " << spec.name << " has an empty MoE block: hidden " << spec.hidden << ", experts "
                   << spec.num_experts << ", intermediate " << spec.expert_intermediate);
  MK_CHECK(spec.is_moe_layer(layer),
           "layer " << layer << " of " << spec.name << " is not an MoE layer");
  if (format == ExpertFormat::Mxfp4 || format == ExpertFormat::Mxfp8) {
    MK_CHECK(spec.hidden % kMxGroup == 0 && spec.expert_intermediate % kMxGroup == 0 &&
                 spec.shared_intermediate % kMxGroup == 0,
             "random " << expert_format_name(format) << " weights need hidden, the expert and the "
                       << "shared intermediate sizes to be multiples of " << kMxGroup << ", got "
                       << spec.hidden << ", " << spec.expert_intermediate << ", "
                       << spec.shared_intermediate << " (" << spec.name << ")");
  }
  return std::make_unique<RandomLayerWeights>(spec, layer, seed, format);
}

}  // namespace moekit
