// The bf16 form of a checkpoint layer's experts (LoadOptions::expert_format Bf16): each routed
// expert used in place where the checkpoint holds it in moekit's layout, else converted once
// (checkpoint_layer.h).
#include <algorithm>
#include <string>
#include <vector>

#include "io/checkpoint_layer.h"
#include "io/finite_check.h"
#include "io/lazy_experts.h"
#include "io/matrix_source.h"
#include "io/tensor_convert.h"

namespace moekit::io {

void CheckpointLayerWeights::build_bf16(int e, ExpertStorage& out) const {
  if (e >= spec_.num_experts) {
    repack_shared_slot(spec_, shared_w13(), shared_w2(), e - spec_.num_experts, out);
    return;
  }
  const size_t H = spec_.hidden, I = spec_.expert_intermediate;
  switch (form_) {
    case ExpertForm::PerExpert: {
      const PerExpertSrc& src = per_expert_[e];
      out.w13.resize(2 * I * H);
      read_bf16(src.gate, out.w13.data());
      read_bf16(src.up, out.w13.data() + I * H);
      if (!(out.view.w2 = direct_bf16(src.down))) {
        out.w2.resize(H * I);
        read_bf16(src.down, out.w2.data());
      }
      break;
    }
    case ExpertForm::Stacked: {
      const PerExpertSrc& src = per_expert_[e];
      if (!(out.view.w13 = direct_bf16(src.gate))) {
        out.w13.resize(2 * I * H);
        read_bf16(src.gate, out.w13.data());
      }
      if (!(out.view.w2 = direct_bf16(src.down))) {
        out.w2.resize(H * I);
        read_bf16(src.down, out.w2.data());
      }
      break;
    }
    case ExpertForm::GptOssDense:
      build_gpt_oss_dense(e, out);
      break;
    case ExpertForm::GptOssMxfp4:
      build_gpt_oss_mxfp4(e, out);
      break;
  }
  read_biases(e, out);
  out.view_owned();
  const std::string ex = "expert " + std::to_string(e);
  check_finite(out.view.w13, 2 * I, H, where(ex + " gate/up weight [2I, H]"));
  check_finite(out.view.w2, H, I, where(ex + " down weight [H, I]"));
  check_finite(out.view.b13, 1, out.view.b13 ? 2 * I : 0, where(ex + " gate/up bias"));
  check_finite(out.view.b2, 1, out.view.b2 ? H : 0, where(ex + " down bias"));
}

void CheckpointLayerWeights::build_gpt_oss_dense(int e, ExpertStorage& out) const {
  const size_t H = spec_.hidden, I = spec_.expert_intermediate;
  out.w13.resize(2 * I * H);
  std::vector<float> row(2 * I);
  for (size_t h = 0; h < H; ++h) {
    read_f32(gate_up_, (e * H + h) * 2 * I, 2 * I, row.data());
    for (size_t i = 0; i < I; ++i) {
      out.w13[i * H + h] = float_to_bf16(row[2 * i]);
      out.w13[(I + i) * H + h] = float_to_bf16(row[2 * i + 1]);
    }
  }
  out.w2.resize(H * I);
  row.resize(H);
  for (size_t i = 0; i < I; ++i) {
    read_f32(down_, (e * I + i) * H, H, row.data());
    for (size_t h = 0; h < H; ++h) out.w2[h * I + i] = float_to_bf16(row[h]);
  }
}

void CheckpointLayerWeights::build_gpt_oss_mxfp4(int e, ExpertStorage& out) const {
  const size_t H = spec_.hidden, I = spec_.expert_intermediate;
  const uint8_t* gb = static_cast<const uint8_t*>(gate_up_.file->raw_data(gate_up_.name()));
  const uint8_t* gs =
      static_cast<const uint8_t*>(gate_up_scales_.file->raw_data(gate_up_scales_.name()));
  const uint8_t* db = static_cast<const uint8_t*>(down_.file->raw_data(down_.name()));
  const uint8_t* ds = static_cast<const uint8_t*>(down_scales_.file->raw_data(down_scales_.name()));
  const size_t gh = H / kMxBlock, gi = I / kMxBlock;
  out.w13.resize(2 * I * H);
  std::vector<float> row(std::max(H, I)), scales(std::max(gh, gi));
  auto decode = [&](const uint8_t* blocks, const uint8_t* e8m0, size_t groups) {
    for (size_t g = 0; g < groups; ++g) scales[g] = e8m0_value(e8m0[g]);
    decode_mxfp4_row(blocks, scales.data(), groups, row.data());
  };
  for (size_t r = 0; r < 2 * I; ++r) {
    const size_t global = e * 2 * I + r;
    decode(gb + global * gh * 16, gs + global * gh, gh);
    Bf16* dst = out.w13.data() + ((r % 2 ? I : 0) + r / 2) * H;
    for (size_t h = 0; h < H; ++h) dst[h] = float_to_bf16(row[h]);
  }
  out.w2.resize(H * I);
  for (size_t h = 0; h < H; ++h) {
    const size_t global = e * H + h;
    decode(db + global * gi * 16, ds + global * gi, gi);
    for (size_t i = 0; i < I; ++i) out.w2[h * I + i] = float_to_bf16(row[i]);
  }
}

void CheckpointLayerWeights::read_biases(int e, ExpertStorage& out) const {
  if (!spec_.has_expert_bias || !gate_up_bias_) return;
  const size_t H = spec_.hidden, I = spec_.expert_intermediate;
  std::vector<float> b(2 * I);
  read_f32(gate_up_bias_, e * 2 * I, 2 * I, b.data());
  out.b13.resize(2 * I);
  for (size_t i = 0; i < I; ++i) {
    out.b13[i] = b[2 * i];
    out.b13[I + i] = b[2 * i + 1];
  }
  out.b2.resize(H);
  read_f32(down_bias_, e * H, H, out.b2.data());
}

}  // namespace moekit::io
