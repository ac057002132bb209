// The fp8 block-scale form of a checkpoint layer's experts (LoadOptions::expert_format
// Fp8Block): its checks, the shared MLP and the routed experts (checkpoint_layer.h).
#include <string>
#include <utility>

#include "io/checkpoint_layer.h"
#include "io/fp8_experts.h"
#include "io/tensor_convert.h"
#include "moekit/error.h"

namespace moekit::io {

void CheckpointLayerWeights::check_fp8_experts() const {
  MK_CHECK(form_ == ExpertForm::PerExpert || form_ == ExpertForm::Stacked,
           "checkpoint " << dir_.path() << ": " << form_name(form_)
                         << " experts have no fp8 block-scale form; load them as BF16");
  MK_CHECK(form_ != ExpertForm::Stacked || spec_.expert_intermediate % kFp8Block == 0,
           "checkpoint " << dir_.path() << ": stacked fp8 gate_up_proj with I = "
                         << spec_.expert_intermediate << " (not a multiple of " << kFp8Block
                         << "): a 128-row scale tile holds gate and up rows together, which "
                         << "moekit's fp8 layout (gate and up tiled separately) cannot hold");
  for (const PerExpertSrc& src : per_expert_) {
    const bool stacked = form_ == ExpertForm::Stacked;
    require_fp8(src.gate, stacked ? "stacked gate_up_proj" : "gate_proj");
    if (form_ == ExpertForm::PerExpert) require_fp8(src.up, "up_proj");
    require_fp8(src.down, "down_proj");
  }
}

void CheckpointLayerWeights::load_shared_fp8(LayerTensors& t) {
  const NameScheme& s = t.scheme();
  const size_t H = spec_.hidden, Is = spec_.shared_intermediate;
  const MatrixSrc gate = t.matrix(s.shared_gate, Is, H, "shared gate_proj, Is x H");
  const MatrixSrc up = t.matrix(s.shared_up, Is, H, "shared up_proj, Is x H");
  const MatrixSrc down = t.matrix(s.shared_down, H, Is, "shared down_proj, H x Is");
  require_fp8(gate, "shared gate_proj");
  require_fp8(up, "shared up_proj");
  require_fp8(down, "shared down_proj");
  ExpertStorage st;
  build_fp8_mlp(gate, &up, down, Is, H, spec_.quant.scale_ue8m0,
                where("shared gate/up weight [2Is, H]"), where("shared down weight [H, Is]"), st);
  shared_w13_fp8_ = std::move(st.w13_fp8);
  shared_w13_scale_ = std::move(st.w13_scale);
  shared_w2_fp8_.assign(st.view.w2_fp8, st.view.w2_fp8 + H * Is);
  shared_w2_scale_ = std::move(st.w2_scale);
}

void CheckpointLayerWeights::build_fp8(int e, ExpertStorage& out) const {
  if (e >= spec_.num_experts) {
    repack_shared_slot_fp8(spec_, *this, e - spec_.num_experts, out);
    return;
  }
  const PerExpertSrc& src = per_expert_[e];
  const std::string ex = "expert " + std::to_string(e);
  build_fp8_mlp(src.gate, form_ == ExpertForm::Stacked ? nullptr : &src.up, src.down,
                spec_.expert_intermediate, spec_.hidden, spec_.quant.scale_ue8m0,
                where(ex + " gate/up weight [2I, H]"), where(ex + " down weight [H, I]"), out);
}

}  // namespace moekit::io
