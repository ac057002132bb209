// load_checkpoint_weights: one MoE layer of a published checkpoint in moekit's layout.
//
// At load: resolve the naming (the spec family's first, then every other, under each known layer
// prefix: the first naming whose router tensor exists wins), then look up and check every tensor
// the layer needs - shape, dtype, fp8 block scale - reading headers only. Router, biases and the
// shared MLP are read now (small, always used). A routed expert is read on its first expert(e)
// call: bf16 data that is already in moekit's layout (a per-expert down_proj, a stacked
// gate_up_proj slice) is used in place in the mapping, so its pages come from disk only when a
// kernel touches them; anything else (gate and up in separate tensors, F16/F32/F8 storage, gpt-oss
// transposed or MXFP4 layouts) is converted into an owned bf16 buffer once. With
// LoadOptions::expert_format Fp8Block the experts and the shared MLP stay e4m3 bytes + fp32 tile
// scales instead (io/fp8_experts.h), and every expert tensor must be F8_E4M3; with Mxfp4 / Mxfp8
// they stay packed bytes + e8m0 scale bytes (io/mx_experts.h). An mxfp8 config (quant_method
// mxfp8) makes every F8_E4M3 expert matrix read with a 1x32 e8m0 scale, in either format.
//
// Every value read is checked for finiteness: router, biases and shared MLP at load, a routed
// expert when it is materialised (after any dequantisation, so a scale that overflows bf16 is
// caught too), block scales as they are read (finite and >= 0).
//
// Router dtype: kept bf16 when both the checkpoint and the spec say bf16, otherwise widened to
// fp32 (exact), so an fp32 router is never rounded and a bf16 router never loses anything.
//
// The layer is io::CheckpointLayerWeights (checkpoint_layer.h). This file builds it: the expert
// form, the router and the bf16 shared MLP; layer_tensors.cpp finds and checks the tensors, and
// checkpoint_experts_bf16.cpp, _fp8.cpp and _mx.cpp hold each expert format's checks, shared MLP
// and experts.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/text_escape.h"
#include "io/checkpoint_layer.h"
#include "io/finite_check.h"
#include "io/tensor_convert.h"
#include "moekit/checkpoint.h"
#include "moekit/error.h"
#include "moekit/weights.h"

namespace moekit {
namespace io {

const char* form_name(ExpertForm f) {
  switch (f) {
    case ExpertForm::PerExpert:
      return "per-expert";
    case ExpertForm::Stacked:
      return "stacked";
    case ExpertForm::GptOssDense:
      return "gpt-oss fused";
    case ExpertForm::GptOssMxfp4:
      return "gpt-oss mxfp4";
  }
  return "?";
}

CheckpointLayerWeights::CheckpointLayerWeights(const MoeSpec& spec, int layer,
                                               const std::string& path, const LoadOptions& options)
    : LayerWeights(spec, layer),
      dir_(path),
      experts_(spec.num_experts + spec.shared_slots(),
               [this](int e, ExpertStorage& out) { build(e, out); }) {
  LayerTensors t = resolve_layer_tensors(dir_, spec_, layer_);
  const NameScheme& s = t.scheme();
  const int64_t E = spec.num_experts, H = spec.hidden, I = spec.expert_intermediate;
  const int64_t Is = spec.shared_intermediate;
  naming_ = s.naming;
  expert_format_ = options.expert_format;
  const bool fp8 = expert_format_ == ExpertFormat::Fp8Block;
  const bool mx = expert_format_ == ExpertFormat::Mxfp4 || expert_format_ == ExpertFormat::Mxfp8;

  load_router(t);

  // Experts: which form, then every expert's tensors checked now (headers only).
  if (s.interleaved) {
    if (t.has(s.stacked_gate_up)) {
      form_ = ExpertForm::GptOssDense;
      gate_up_ = t.require_float(s.stacked_gate_up, {E, H, 2 * I}, "fused gate/up, E x H x 2I");
      down_ = t.require_float(s.stacked_down, {E, I, H}, "fused down, E x I x H");
    } else if (t.has(s.stacked_gate_up + "_blocks")) {
      form_ = ExpertForm::GptOssMxfp4;
      MK_CHECK(H % kMxBlock == 0 && I % kMxBlock == 0,
               "MXFP4 experts need hidden and intermediate sizes divisible by 32, got H = "
                   << H << ", I = " << I);
      gate_up_ = t.require_u8(s.stacked_gate_up + "_blocks", {E, 2 * I, H / 32, 16},
                              "MXFP4 gate/up blocks, E x 2I x H/32 x 16");
      gate_up_scales_ = t.require_u8(s.stacked_gate_up + "_scales", {E, 2 * I, H / 32},
                                     "MXFP4 gate/up scales, E x 2I x H/32");
      down_ = t.require_u8(s.stacked_down + "_blocks", {E, H, I / 32, 16},
                           "MXFP4 down blocks, E x H x I/32 x 16");
      down_scales_ = t.require_u8(s.stacked_down + "_scales", {E, H, I / 32},
                                  "MXFP4 down scales, E x H x I/32");
    } else {
      MK_FAIL("checkpoint " << dir_.path() << " has no experts for layer " << layer << " of "
                            << spec.name << ": tried '" << t.full(s.stacked_gate_up) << "' and '"
                            << t.full(s.stacked_gate_up + "_blocks") << "'");
    }
    if (spec.has_expert_bias) {
      gate_up_bias_ = t.require_float(s.stacked_gate_up_bias, {E, 2 * I}, "gate/up bias, E x 2I");
      down_bias_ = t.require_float(s.stacked_down_bias, {E, H}, "down bias, E x H");
    }
  } else if (!s.expert_gate.empty() && t.has(s.expert_gate, 0)) {
    form_ = ExpertForm::PerExpert;
    per_expert_.reserve(E);
    for (int e = 0; e < E; ++e) {
      PerExpertSrc src;
      src.gate = t.matrix(s.expert_gate, I, H, "expert gate_proj, I x H", e);
      src.up = t.matrix(s.expert_up, I, H, "expert up_proj, I x H", e);
      src.down = t.matrix(s.expert_down, H, I, "expert down_proj, H x I", e);
      per_expert_.push_back(std::move(src));
    }
  } else if (t.has(s.stacked_gate_up)) {
    form_ = ExpertForm::Stacked;
    for (int e = 0; e < E; ++e) {
      PerExpertSrc src;
      src.gate = t.matrix(s.stacked_gate_up, 2 * I, H, "stacked gate_up_proj, E x 2I x H", -1,
                          static_cast<int>(E), e);
      src.down = t.matrix(s.stacked_down, H, I, "stacked down_proj, E x H x I", -1,
                          static_cast<int>(E), e);
      per_expert_.push_back(std::move(src));
    }
  } else {
    MK_FAIL("checkpoint " << dir_.path() << " has no experts for layer " << layer << " of "
                          << spec.name << ": tried '" << t.full(s.expert_gate, 0) << "' and '"
                          << t.full(s.stacked_gate_up) << "'");
  }

  if (fp8) check_fp8_experts();
  if (mx) check_mx_experts();

  // Shared MLP, read now: every token uses it.
  if (spec.shared_kind != SharedKind::None) {
    MK_CHECK(!s.shared_gate.empty(), "spec " << spec.name << " has a shared expert, but the "
                                             << checkpoint_naming_name(s.naming)
                                             << " naming has none");
    if (fp8) {
      load_shared_fp8(t);
    } else if (mx) {
      load_shared_mx(t);
    } else {
      const size_t h = H, is = Is;
      shared_w13_.resize(2 * is * h);
      shared_w2_.resize(h * is);
      read_bf16(t.matrix(s.shared_gate, is, h, "shared gate_proj, Is x H"), shared_w13_.data());
      read_bf16(t.matrix(s.shared_up, is, h, "shared up_proj, Is x H"),
                shared_w13_.data() + is * h);
      read_bf16(t.matrix(s.shared_down, h, is, "shared down_proj, H x Is"), shared_w2_.data());
      check_finite(shared_w13_.data(), 2 * is, h, where("shared gate/up weight [2Is, H]"));
      check_finite(shared_w2_.data(), h, is, where("shared down weight [H, Is]"));
    }
  }
}

std::string CheckpointLayerWeights::origin() const {
  return "checkpoint " + escape_text(dir_.path()) + " (" + checkpoint_naming_name(naming_) +
         " naming, " + form_name(form_) + " experts" +
         (expert_format_ == ExpertFormat::Bf16
              ? std::string(")")
              : std::string(", kept in ") + expert_format_name(expert_format_) + ")");
}

void CheckpointLayerWeights::load_router(LayerTensors& t) {
  const NameScheme& s = t.scheme();
  const int64_t E = spec_.num_experts, H = spec_.hidden;
  const size_t h = H;
  TensorRef router = t.require_float(s.router, {E, H}, "router weight, E x H");
  TensorRef shared_gate;
  if (spec_.shared_kind == SharedKind::Gated) {
    MK_CHECK(!s.shared_expert_gate.empty(),
             "spec " << spec_.name << " has a gated shared expert, but the "
                     << checkpoint_naming_name(s.naming) << " naming has no shared-expert gate");
    shared_gate = t.require_float(s.shared_expert_gate, {1, H}, "shared expert gate, 1 x H");
  }
  bool keep_bf16 = spec_.router_dtype == DType::BF16 && router.info->dtype == DType::BF16;
  if (shared_gate && shared_gate.info->dtype != DType::BF16) keep_bf16 = false;
  spec_.router_dtype = keep_bf16 ? DType::BF16 : DType::F32;
  const size_t rows = spec_.router_columns();
  const std::string what = "checkpoint tensor " + router.where() + " (router weight" +
                           (shared_gate ? " and shared expert gate)" : ")");
  if (keep_bf16) {
    router_weight_.resize(rows * h * 2);
    Bf16* out = reinterpret_cast<Bf16*>(router_weight_.data());
    std::memcpy(out, router.file->data(router.name()), E * h * 2);
    if (shared_gate) std::memcpy(out + E * h, shared_gate.file->data(shared_gate.name()), h * 2);
    check_finite(out, rows, h, what);
  } else {
    router_weight_.resize(rows * h * 4);
    float* out = reinterpret_cast<float*>(router_weight_.data());
    read_f32(router, 0, E * h, out);
    if (shared_gate) read_f32(shared_gate, 0, h, out + E * h);
    check_finite(out, rows, h, what);
  }

  if (spec_.has_correction_bias) {
    MK_CHECK(!s.correction_bias.empty(),
             "spec " << spec_.name << " uses a correction bias, but the "
                     << checkpoint_naming_name(s.naming) << " naming has none");
    if (!t.has(s.correction_bias) && t.has(s.block + "gate.tid2eid")) {
      MK_FAIL("layer " << layer_ << " of " << spec_.name << " in " << dir_.path()
                       << " is hash-routed ('" << t.full(s.block + "gate.tid2eid")
                       << "', no score bias; num_hash_layers = " << spec_.num_hash_layers
                       << "): moekit runs the score-routed layers only");
    }
    TensorRef b = t.require_float(s.correction_bias, {E}, "e_score_correction_bias, E");
    correction_bias_.resize(E);
    read_f32(b, 0, E, correction_bias_.data());
    // A NaN bias would put its expert into every token's top-k (NaN compares as largest).
    check_finite(correction_bias_.data(), 1, E,
                 "checkpoint tensor " + b.where() + " (e_score_correction_bias)");
  } else if (!s.correction_bias.empty() && t.has(s.correction_bias)) {
    // Dropping the bias would route every token differently from the model, silently.
    MK_FAIL("checkpoint " << dir_.path() << " holds '" << t.full(s.correction_bias)
                          << "', a routing correction bias, but spec " << spec_.name
                          << " (model_type " << spec_.model_type << ", "
                          << scoring_name(spec_.scoring)
                          << " scoring) routes without one: the config does not describe "
                             "this checkpoint");
  }
  if (spec_.has_router_bias) {
    MK_CHECK(!s.router_bias.empty(), "spec " << spec_.name << " has a router bias, but the "
                                             << checkpoint_naming_name(s.naming)
                                             << " naming has none");
    TensorRef b = t.require_float(s.router_bias, {E}, "router bias, E");
    router_bias_.resize(E);
    read_f32(b, 0, E, router_bias_.data());
    check_finite(router_bias_.data(), 1, E, "checkpoint tensor " + b.where() + " (router bias)");
  }
}

void CheckpointLayerWeights::build(int e, ExpertStorage& out) const {
  if (expert_format_ == ExpertFormat::Fp8Block) {
    build_fp8(e, out);
    return;
  }
  if (expert_format_ == ExpertFormat::Mxfp4 || expert_format_ == ExpertFormat::Mxfp8) {
    build_mx(e, out);
    return;
  }
  build_bf16(e, out);
}

std::string CheckpointLayerWeights::where(const std::string& what) const {
  return "checkpoint " + escape_text(dir_.path()) + ", layer " + std::to_string(layer_) + ": " +
         what;
}

}  // namespace io

std::unique_ptr<LayerWeights> load_checkpoint_weights(const MoeSpec& spec, int layer,
                                                      const std::string& dir,
                                                      const LoadOptions& options) {
  MK_CHECK(spec.hidden > 0 && spec.num_experts > 0 && spec.expert_intermediate > 0,
           "spec " << spec.name << " has an empty MoE block");
  MK_CHECK(spec.is_moe_layer(layer),
           "layer " << layer << " of " << spec.name << " is not an MoE layer");
  return std::make_unique<io::CheckpointLayerWeights>(spec, layer, dir, options);
}

}  // namespace moekit
