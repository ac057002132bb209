// The MX form of a checkpoint layer's experts (LoadOptions::expert_format Mxfp4 / Mxfp8): its
// checks, the shared MLP and the routed experts (checkpoint_layer.h).
#include <cstdint>
#include <string>
#include <utility>

#include "io/checkpoint_layer.h"
#include "io/finite_check.h"
#include "io/mx_experts.h"
#include "io/tensor_convert.h"
#include "moekit/error.h"

namespace moekit::io {

void CheckpointLayerWeights::check_mx_experts() const {
  const char* want = expert_format_name(expert_format_);
  if (expert_format_ == ExpertFormat::Mxfp4) {
    MK_CHECK(form_ == ExpertForm::GptOssMxfp4,
             "checkpoint " << dir_.path() << ": " << form_name(form_)
                           << " experts have no mxfp4 form (expected gpt-oss's "
                           << "gate_up_proj_blocks / _scales); load them as bf16");
    return;
  }
  MK_CHECK(spec_.quant.kind == QuantKind::Mxfp8,
           "checkpoint " << dir_.path() << ": expert format " << want << " needs a config whose "
                         << "quantization_config.quant_method is mxfp8, got "
                         << quant_kind_name(spec_.quant.kind));
  MK_CHECK(form_ == ExpertForm::PerExpert || form_ == ExpertForm::Stacked,
           "checkpoint " << dir_.path() << ": " << form_name(form_)
                         << " experts have no mxfp8 form; load them as bf16");
  for (const PerExpertSrc& src : per_expert_) {
    const bool stacked = form_ == ExpertForm::Stacked;
    require_mxfp8(src.gate, stacked ? "stacked gate_up_proj" : "gate_proj");
    if (form_ == ExpertForm::PerExpert) require_mxfp8(src.up, "up_proj");
    require_mxfp8(src.down, "down_proj");
  }
}

void CheckpointLayerWeights::load_shared_mx(LayerTensors& t) {
  MK_CHECK(expert_format_ == ExpertFormat::Mxfp8,
           "spec " << spec_.name << " has a shared expert, which moekit reads in mxfp4 only "
                   << "from gpt-oss's expert tensors; load the layer as bf16");
  const NameScheme& s = t.scheme();
  const size_t H = spec_.hidden, Is = spec_.shared_intermediate;
  const MatrixSrc gate = t.matrix(s.shared_gate, Is, H, "shared gate_proj, Is x H");
  const MatrixSrc up = t.matrix(s.shared_up, Is, H, "shared up_proj, Is x H");
  const MatrixSrc down = t.matrix(s.shared_down, H, Is, "shared down_proj, H x Is");
  require_mxfp8(gate, "shared gate_proj");
  require_mxfp8(up, "shared up_proj");
  require_mxfp8(down, "shared down_proj");
  ExpertStorage st;
  build_mxfp8_mlp(gate, &up, down, Is, H, where("shared gate/up weight [2Is, H]"),
                  where("shared down weight [H, Is]"), st);
  shared_w13_mx_ = std::move(st.w13_mx);
  shared_w13_mx_scale_ = std::move(st.w13_mx_scale);
  shared_w2_mx_.assign(st.view.w2_mx, st.view.w2_mx + H * Is);
  shared_w2_mx_scale_.assign(st.view.w2_mx_scale, st.view.w2_mx_scale + H * (Is / kMxBlock));
}

void CheckpointLayerWeights::build_mx(int e, ExpertStorage& out) const {
  if (e >= spec_.num_experts) {
    repack_shared_slot_mx(spec_, *this, e - spec_.num_experts, out);
    return;
  }
  const size_t H = spec_.hidden, I = spec_.expert_intermediate;
  const std::string ex = "expert " + std::to_string(e);
  if (expert_format_ == ExpertFormat::Mxfp4) {
    auto bytes = [](const TensorRef& t) {
      return static_cast<const uint8_t*>(t.file->raw_data(t.name()));
    };
    const size_t g = H / kMxBlock, gi = I / kMxBlock;
    io::build_gpt_oss_mxfp4(
        bytes(gate_up_) + e * 2 * I * H / 2, bytes(gate_up_scales_) + e * 2 * I * g,
        bytes(down_) + e * H * I / 2, bytes(down_scales_) + e * H * gi, I, H,
        where(ex + " gate/up blocks [2I, H/2]"), where(ex + " down blocks [H, I/2]"), out);
  } else {
    const PerExpertSrc& src = per_expert_[e];
    build_mxfp8_mlp(src.gate, form_ == ExpertForm::Stacked ? nullptr : &src.up, src.down, I, H,
                    where(ex + " gate/up weight [2I, H]"), where(ex + " down weight [H, I]"), out);
  }
  read_biases(e, out);
  out.view_owned();
  check_finite(out.view.b13, 1, out.view.b13 ? 2 * I : 0, where(ex + " gate/up bias"));
  check_finite(out.view.b2, 1, out.view.b2 ? H : 0, where(ex + " down bias"));
}

}  // namespace moekit::io
