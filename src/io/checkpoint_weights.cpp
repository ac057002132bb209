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
#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "io/checkpoint_dir.h"
#include "common/text_escape.h"
#include "io/checkpoint_names.h"
#include "io/finite_check.h"
#include "io/fp8_experts.h"
#include "io/lazy_experts.h"
#include "io/matrix_source.h"
#include "io/mx_experts.h"
#include "io/tensor_convert.h"
#include "moekit/checkpoint.h"
#include "moekit/error.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

using io::MatrixSrc;
using io::TensorRef;
using io::direct_bf16;
using io::read_bf16;
using io::read_f32;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string quoted_list(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", '" : "'") + v[i] + "'";
  return out;
}

enum class ExpertForm { PerExpert, Stacked, GptOssDense, GptOssMxfp4 };

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

// Finds and checks one layer's tensors; every message names the tensor, what was expected and
// what the checkpoint holds.
class LayerTensors {
 public:
  LayerTensors(io::CheckpointDir& dir, const MoeSpec& spec, int layer, io::NameScheme scheme,
               std::string prefix)
      : dir_(dir), spec_(spec), layer_(layer), s_(std::move(scheme)), prefix_(std::move(prefix)) {}

  const io::NameScheme& scheme() const { return s_; }
  std::string full(const std::string& rel, int expert = -1) const {
    return prefix_ + io::expand(rel, layer_, expert);
  }
  bool has(const std::string& rel, int expert = -1) const { return dir_.has(full(rel, expert)); }

  TensorRef require(const std::string& rel, const std::vector<int64_t>& shape,
                    const std::string& what, int expert = -1) {
    const std::string name = full(rel, expert);
    TensorRef t = dir_.find(name);
    MK_CHECK(t, "checkpoint " << dir_.path() << " has no tensor '" << name << "' (" << what
                              << " of layer " << layer_ << " of " << spec_.name << ", "
                              << checkpoint_naming_name(s_.naming) << " naming)");
    MK_CHECK(t.shape() == shape, "checkpoint tensor " << t.where() << ": expected shape "
                                                      << shape_str(shape) << " (" << what
                                                      << "), got " << shape_str(t.shape()));
    return t;
  }

  // A float tensor (BF16, F16 or F32) with the given shape.
  TensorRef require_float(const std::string& rel, const std::vector<int64_t>& shape,
                          const std::string& what) {
    TensorRef t = require(rel, shape, what);
    const auto& info = *t.info;
    MK_CHECK(info.dtype_supported && info.dtype != DType::F8_E4M3,
             "checkpoint tensor " << t.where() << " (" << what << "): expected dtype BF16, F16 or "
                                  << "F32, got " << info.dtype_name);
    return t;
  }

  TensorRef require_u8(const std::string& rel, const std::vector<int64_t>& shape,
                       const std::string& what) {
    TensorRef t = require(rel, shape, what);
    MK_CHECK(t.info->dtype_name == "U8", "checkpoint tensor " << t.where() << " (" << what
                                                              << "): expected dtype U8, got "
                                                              << t.info->dtype_name);
    return t;
  }

  // A [rows, cols] weight (or `stack` of them, taking number `index`): BF16/F16/F32, F8_E4M3
  // with a 128x128 block scale, or packed FP4 e2m1 (I8/U8 [rows, cols/2], low nibble first, as
  // DeepSeek-V4 publishes its experts) with a 1x32 e8m0 scale [rows, cols/32].
  MatrixSrc matrix(const std::string& rel, size_t rows, size_t cols, const std::string& what,
                   int expert = -1, int stack = 0, int index = 0) {
    std::vector<int64_t> lead;
    if (stack > 0) lead.push_back(stack);
    auto with = [&](size_t r, size_t c) {
      std::vector<int64_t> v = lead;
      v.push_back(static_cast<int64_t>(r));
      v.push_back(static_cast<int64_t>(c));
      return v;
    };
    const std::string name = full(rel, expert);
    MatrixSrc m;
    m.rows = rows;
    m.cols = cols;
    m.w = dir_.find(name);
    const bool packed_fp4 = m.w && (m.w.info->dtype_name == "I8" || m.w.info->dtype_name == "U8") &&
                            cols % io::kMxBlock == 0 && m.w.shape() == with(rows, cols / 2);
    if (packed_fp4) {
      m.fp4 = true;
      m.offset = static_cast<size_t>(index) * rows * cols / 2;
      m.scale = find_scale(m.w, with(rows, cols / io::kMxBlock), what, "1x32 blocks");
      m.scale_offset = static_cast<size_t>(index) * rows * (cols / io::kMxBlock);
      return m;
    }
    m.w = require(rel, with(rows, cols), what, expert);
    m.offset = static_cast<size_t>(index) * rows * cols;
    const auto& info = *m.w.info;
    MK_CHECK(info.dtype_supported, "checkpoint tensor " << m.w.where() << " (" << what
                                                        << "): expected dtype BF16, F16, F32 or "
                                                           "F8_E4M3, got "
                                                        << info.dtype_name);
    m.dtype = info.dtype;
    if (m.dtype == DType::F8_E4M3 && spec_.quant.kind == QuantKind::Mxfp8) {
      // mxfp8 (the config's quant_method): one e8m0 byte per 32 input elements of each row
      MK_CHECK(cols % io::kMxBlock == 0,
               "checkpoint tensor " << m.w.where() << " (" << what << "): rows of " << cols
                                    << " columns are not a whole number of 32-element mxfp8 "
                                    << "blocks (quantization_config.weight_block_size [1, 32])");
      m.mx8 = true;
      m.scale = find_mx_scale(m.w, with(rows, cols / io::kMxBlock), what);
      m.scale_offset = static_cast<size_t>(index) * rows * (cols / io::kMxBlock);
    } else if (m.dtype == DType::F8_E4M3) {
      const size_t rb = io::ceil_div(rows, io::kFp8Block), kb = io::ceil_div(cols, io::kFp8Block);
      m.scale = find_scale(m.w, with(rb, kb), what, "128x128 blocks");
      m.scale_offset = static_cast<size_t>(index) * rb * kb;
    }
    return m;
  }

 private:
  // The e8m0 scale of an mxfp8 weight: U8 or F8_E8M0 bytes, [.., rows, cols/32].
  TensorRef find_mx_scale(const TensorRef& w, const std::vector<int64_t>& shape,
                          const std::string& what) {
    const std::vector<std::string> candidates = io::mx_scale_names(w.name());
    TensorRef scale;
    for (const std::string& sn : candidates) {
      if ((scale = dir_.find(sn))) break;
    }
    MK_CHECK(scale, "checkpoint tensor " << w.where() << " (" << what
                                         << ") is F8_E4M3 in an mxfp8 checkpoint but has no e8m0 "
                                         << "scale: tried " << quoted_list(candidates));
    MK_CHECK(scale.shape() == shape, "checkpoint tensor " << scale.where() << " (mxfp8 scale of "
                                                          << what << "): expected shape "
                                                          << shape_str(shape)
                                                          << " (one per 1x32 block), got "
                                                          << shape_str(scale.shape()));
    const std::string& d = scale.info->dtype_name;
    MK_CHECK(d == "U8" || d == "F8_E8M0",
             "checkpoint tensor " << scale.where() << " (mxfp8 scale of " << what
                                  << "): expected dtype U8 or F8_E8M0 (e8m0 exponent bytes), got "
                                  << d);
    return scale;
  }

  TensorRef find_scale(const TensorRef& w, const std::vector<int64_t>& shape,
                       const std::string& what, const char* blocks) {
    const std::vector<std::string> candidates = io::scale_names(w.name());
    TensorRef scale;
    for (const std::string& sn : candidates) {
      if ((scale = dir_.find(sn))) break;
    }
    MK_CHECK(scale, "checkpoint tensor " << w.where() << " (" << what << ") is "
                                         << w.info->dtype_name << " but has no block scale: tried "
                                         << quoted_list(candidates));
    MK_CHECK(scale.shape() == shape, "checkpoint tensor " << scale.where() << " (block scale of "
                                                          << what << "): expected shape "
                                                          << shape_str(shape) << " (" << blocks
                                                          << "), got " << shape_str(scale.shape()));
    MK_CHECK(io::is_scale_dtype(scale.info->dtype_name),
             "checkpoint tensor " << scale.where() << " (block scale of " << what
                                  << "): expected dtype F32, BF16, F16 or F8_E8M0, got "
                                  << scale.info->dtype_name);
    return scale;
  }

  io::CheckpointDir& dir_;
  const MoeSpec& spec_;
  int layer_;
  io::NameScheme s_;
  std::string prefix_;
};

class CheckpointLayerWeights final : public LayerWeights {
 public:
  CheckpointLayerWeights(const MoeSpec& spec, int layer, const std::string& path,
                         const LoadOptions& options)
      : LayerWeights(spec, layer),
        dir_(path),
        experts_(spec.num_experts + spec.shared_slots(),
                 [this](int e, io::ExpertStorage& out) { build(e, out); }) {
    LayerTensors t = resolve();
    const io::NameScheme& s = t.scheme();
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
        MK_CHECK(H % io::kMxBlock == 0 && I % io::kMxBlock == 0,
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
        io::check_finite(shared_w13_.data(), 2 * is, h, where("shared gate/up weight [2Is, H]"));
        io::check_finite(shared_w2_.data(), h, is, where("shared down weight [H, Is]"));
      }
    }
  }

  ExpertView expert(int e) const override { return experts_.get(e); }
  int materialised_experts() const override { return experts_.materialised(); }
  std::string origin() const override {
    return "checkpoint " + escape_text(dir_.path()) + " (" + checkpoint_naming_name(naming_) + " naming, " +
           form_name(form_) + " experts" +
           (expert_format_ == ExpertFormat::Bf16
                ? std::string(")")
                : std::string(", kept in ") + expert_format_name(expert_format_) + ")");
  }

 private:
  struct PerExpertSrc {
    MatrixSrc gate, up, down;  // Stacked: gate holds the whole [2I, H] gate_up slice
  };

  // With the experts kept in fp8: every expert matrix is F8_E4M3 with a 128x128 scale, and a
  // stacked gate_up's gate/up boundary falls on a tile edge (its [ceil(2I/128), .] scale grid
  // then splits into the gate's and the up's, ExpertView's layout).
  void check_fp8_experts() const {
    MK_CHECK(form_ == ExpertForm::PerExpert || form_ == ExpertForm::Stacked,
             "checkpoint " << dir_.path() << ": " << form_name(form_)
                           << " experts have no fp8 block-scale form; load them as BF16");
    MK_CHECK(form_ != ExpertForm::Stacked || spec_.expert_intermediate % io::kFp8Block == 0,
             "checkpoint " << dir_.path() << ": stacked fp8 gate_up_proj with I = "
                           << spec_.expert_intermediate << " (not a multiple of " << io::kFp8Block
                           << "): a 128-row scale tile holds gate and up rows together, which "
                           << "moekit's fp8 layout (gate and up tiled separately) cannot hold");
    for (const PerExpertSrc& src : per_expert_) {
      const bool stacked = form_ == ExpertForm::Stacked;
      io::require_fp8(src.gate, stacked ? "stacked gate_up_proj" : "gate_proj");
      if (form_ == ExpertForm::PerExpert) io::require_fp8(src.up, "up_proj");
      io::require_fp8(src.down, "down_proj");
    }
  }

  // With the experts kept in an MX format: Mxfp4 is gpt-oss's _blocks / _scales form; Mxfp8
  // takes per-expert or stacked F8_E4M3 matrices with 1x32 e8m0 scales (quant_method mxfp8).
  void check_mx_experts() const {
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
      io::require_mxfp8(src.gate, stacked ? "stacked gate_up_proj" : "gate_proj");
      if (form_ == ExpertForm::PerExpert) io::require_mxfp8(src.up, "up_proj");
      io::require_mxfp8(src.down, "down_proj");
    }
  }

  void load_shared_mx(LayerTensors& t) {
    MK_CHECK(expert_format_ == ExpertFormat::Mxfp8,
             "spec " << spec_.name << " has a shared expert, which moekit reads in mxfp4 only "
                     << "from gpt-oss's expert tensors; load the layer as bf16");
    const io::NameScheme& s = t.scheme();
    const size_t H = spec_.hidden, Is = spec_.shared_intermediate;
    const io::MatrixSrc gate = t.matrix(s.shared_gate, Is, H, "shared gate_proj, Is x H");
    const io::MatrixSrc up = t.matrix(s.shared_up, Is, H, "shared up_proj, Is x H");
    const io::MatrixSrc down = t.matrix(s.shared_down, H, Is, "shared down_proj, H x Is");
    io::require_mxfp8(gate, "shared gate_proj");
    io::require_mxfp8(up, "shared up_proj");
    io::require_mxfp8(down, "shared down_proj");
    io::ExpertStorage st;
    io::build_mxfp8_mlp(gate, &up, down, Is, H, where("shared gate/up weight [2Is, H]"),
                        where("shared down weight [H, Is]"), st);
    shared_w13_mx_ = std::move(st.w13_mx);
    shared_w13_mx_scale_ = std::move(st.w13_mx_scale);
    shared_w2_mx_.assign(st.view.w2_mx, st.view.w2_mx + H * Is);
    shared_w2_mx_scale_.assign(st.view.w2_mx_scale, st.view.w2_mx_scale + H * (Is / io::kMxBlock));
  }

  // Expert e in an MX format: packed bytes and e8m0 bytes, in place where one tensor holds them.
  void build_mx(int e, io::ExpertStorage& out) const {
    if (e >= spec_.num_experts) {
      io::repack_shared_slot_mx(spec_, *this, e - spec_.num_experts, out);
      return;
    }
    const size_t H = spec_.hidden, I = spec_.expert_intermediate;
    const std::string ex = "expert " + std::to_string(e);
    if (expert_format_ == ExpertFormat::Mxfp4) {
      auto bytes = [](const TensorRef& t) {
        return static_cast<const uint8_t*>(t.file->raw_data(t.name()));
      };
      const size_t g = H / io::kMxBlock, gi = I / io::kMxBlock;
      io::build_gpt_oss_mxfp4(bytes(gate_up_) + e * 2 * I * H / 2,
                              bytes(gate_up_scales_) + e * 2 * I * g,
                              bytes(down_) + e * H * I / 2, bytes(down_scales_) + e * H * gi, I,
                              H, where(ex + " gate/up blocks [2I, H/2]"),
                              where(ex + " down blocks [H, I/2]"), out);
    } else {
      const PerExpertSrc& src = per_expert_[e];
      io::build_mxfp8_mlp(src.gate, form_ == ExpertForm::Stacked ? nullptr : &src.up, src.down, I,
                          H, where(ex + " gate/up weight [2I, H]"),
                          where(ex + " down weight [H, I]"), out);
    }
    read_biases(e, out);
    out.view_owned();
    io::check_finite(out.view.b13, 1, out.view.b13 ? 2 * I : 0, where(ex + " gate/up bias"));
    io::check_finite(out.view.b2, 1, out.view.b2 ? H : 0, where(ex + " down bias"));
  }

  // gpt-oss's biases: gate_up_proj_bias is interleaved like the gate_up rows (gate even, up odd).
  void read_biases(int e, io::ExpertStorage& out) const {
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

  void load_shared_fp8(LayerTensors& t) {
    const io::NameScheme& s = t.scheme();
    const size_t H = spec_.hidden, Is = spec_.shared_intermediate;
    const io::MatrixSrc gate = t.matrix(s.shared_gate, Is, H, "shared gate_proj, Is x H");
    const io::MatrixSrc up = t.matrix(s.shared_up, Is, H, "shared up_proj, Is x H");
    const io::MatrixSrc down = t.matrix(s.shared_down, H, Is, "shared down_proj, H x Is");
    io::require_fp8(gate, "shared gate_proj");
    io::require_fp8(up, "shared up_proj");
    io::require_fp8(down, "shared down_proj");
    io::ExpertStorage st;
    io::build_fp8_mlp(gate, &up, down, Is, H, spec_.quant.scale_ue8m0,
                      where("shared gate/up weight [2Is, H]"), where("shared down weight [H, Is]"),
                      st);
    shared_w13_fp8_ = std::move(st.w13_fp8);
    shared_w13_scale_ = std::move(st.w13_scale);
    shared_w2_fp8_.assign(st.view.w2_fp8, st.view.w2_fp8 + H * Is);
    shared_w2_scale_ = std::move(st.w2_scale);
  }

  // Expert e in fp8: e4m3 bytes in place where one tensor holds the matrix, scales in fp32.
  void build_fp8(int e, io::ExpertStorage& out) const {
    if (e >= spec_.num_experts) {
      io::repack_shared_slot_fp8(spec_, *this, e - spec_.num_experts, out);
      return;
    }
    const PerExpertSrc& src = per_expert_[e];
    const std::string ex = "expert " + std::to_string(e);
    io::build_fp8_mlp(src.gate, form_ == ExpertForm::Stacked ? nullptr : &src.up, src.down,
                      spec_.expert_intermediate, spec_.hidden, spec_.quant.scale_ue8m0,
                      where(ex + " gate/up weight [2I, H]"), where(ex + " down weight [H, I]"),
                      out);
  }

  // The first naming (spec family's first), block and layer prefix whose router tensor exists.
  LayerTensors resolve() {
    std::vector<CheckpointNaming> order = {checkpoint_naming_for(spec_)};
    for (CheckpointNaming n :
         {CheckpointNaming::HfMlp, CheckpointNaming::Qwen2Moe, CheckpointNaming::Mixtral,
          CheckpointNaming::MiniMax, CheckpointNaming::DeepSeekV4, CheckpointNaming::GptOss}) {
      if (n != order[0]) order.push_back(n);
    }
    std::vector<std::string> tried;
    for (CheckpointNaming n : order) {
      for (const std::string& block : io::block_candidates(n)) {
        io::NameScheme s = io::name_scheme(n, block);
        for (const std::string& p : io::layer_prefix_candidates()) {
          const std::string prefix = io::expand(p, layer_);
          if (dir_.has(prefix + s.router)) return LayerTensors(dir_, spec_, layer_, s, prefix);
          if (n == order[0]) tried.push_back(prefix + s.router);
        }
      }
    }
    const std::string layer_fragment = "layers." + std::to_string(layer_) + ".";
    std::vector<std::string> seen = dir_.names_like(layer_fragment, 6);
    if (seen.empty()) seen = dir_.names_like("", 6);
    MK_FAIL("checkpoint " << dir_.path() << " has no router for layer " << layer_ << " of "
                          << spec_.name << ": tried " << quoted_list(tried)
                          << " and the other families' names; it holds " << dir_.tensor_count()
                          << " tensors, e.g. " << quoted_list(seen));
  }

  void load_router(LayerTensors& t) {
    const io::NameScheme& s = t.scheme();
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
      io::check_finite(out, rows, h, what);
    } else {
      router_weight_.resize(rows * h * 4);
      float* out = reinterpret_cast<float*>(router_weight_.data());
      read_f32(router, 0, E * h, out);
      if (shared_gate) read_f32(shared_gate, 0, h, out + E * h);
      io::check_finite(out, rows, h, what);
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
      io::check_finite(correction_bias_.data(), 1, E,
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
      io::check_finite(router_bias_.data(), 1, E,
                       "checkpoint tensor " + b.where() + " (router bias)");
    }
  }

  void build(int e, io::ExpertStorage& out) const {
    if (expert_format_ == ExpertFormat::Fp8Block) {
      build_fp8(e, out);
      return;
    }
    if (expert_format_ == ExpertFormat::Mxfp4 || expert_format_ == ExpertFormat::Mxfp8) {
      build_mx(e, out);
      return;
    }
    if (e >= spec_.num_experts) {
      io::repack_shared_slot(spec_, shared_w13(), shared_w2(), e - spec_.num_experts, out);
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
    io::check_finite(out.view.w13, 2 * I, H, where(ex + " gate/up weight [2I, H]"));
    io::check_finite(out.view.w2, H, I, where(ex + " down weight [H, I]"));
    io::check_finite(out.view.b13, 1, out.view.b13 ? 2 * I : 0, where(ex + " gate/up bias"));
    io::check_finite(out.view.b2, 1, out.view.b2 ? H : 0, where(ex + " down bias"));
  }

  // "checkpoint <dir>, layer L: <what>" for the finiteness checks.
  std::string where(const std::string& what) const {
    return "checkpoint " + escape_text(dir_.path()) + ", layer " + std::to_string(layer_) + ": " +
           what;
  }

  // gate_up [E, H, 2I] used as x . W: w13[i][h] = W[h][2i] (gate), w13[I+i][h] = W[h][2i+1] (up);
  // down [E, I, H]: w2[h][i] = D[i][h].
  void build_gpt_oss_dense(int e, io::ExpertStorage& out) const {
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

  // MXFP4 blocks decode to [E, 2I, H] (rows interleaved gate/up, before transformers' transpose
  // to [E, H, 2I]) and [E, H, I] (already moekit's w2 layout).
  void build_gpt_oss_mxfp4(int e, io::ExpertStorage& out) const {
    const size_t H = spec_.hidden, I = spec_.expert_intermediate;
    const uint8_t* gb = static_cast<const uint8_t*>(gate_up_.file->raw_data(gate_up_.name()));
    const uint8_t* gs =
        static_cast<const uint8_t*>(gate_up_scales_.file->raw_data(gate_up_scales_.name()));
    const uint8_t* db = static_cast<const uint8_t*>(down_.file->raw_data(down_.name()));
    const uint8_t* ds =
        static_cast<const uint8_t*>(down_scales_.file->raw_data(down_scales_.name()));
    const size_t gh = H / io::kMxBlock, gi = I / io::kMxBlock;
    out.w13.resize(2 * I * H);
    std::vector<float> row(std::max(H, I)), scales(std::max(gh, gi));
    auto decode = [&](const uint8_t* blocks, const uint8_t* e8m0, size_t groups) {
      for (size_t g = 0; g < groups; ++g) scales[g] = io::e8m0_value(e8m0[g]);
      io::decode_mxfp4_row(blocks, scales.data(), groups, row.data());
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

  io::CheckpointDir dir_;
  CheckpointNaming naming_ = CheckpointNaming::HfMlp;
  ExpertForm form_ = ExpertForm::PerExpert;
  std::vector<PerExpertSrc> per_expert_;
  TensorRef gate_up_, down_, gate_up_scales_, down_scales_, gate_up_bias_, down_bias_;
  io::LazyExperts experts_;
};

}  // namespace

std::unique_ptr<LayerWeights> load_checkpoint_weights(const MoeSpec& spec, int layer,
                                                      const std::string& dir,
                                                      const LoadOptions& options) {
  MK_CHECK(spec.hidden > 0 && spec.num_experts > 0 && spec.expert_intermediate > 0,
           "spec " << spec.name << " has an empty MoE block");
  MK_CHECK(spec.is_moe_layer(layer),
           "layer " << layer << " of " << spec.name << " is not an MoE layer");
  return std::make_unique<CheckpointLayerWeights>(spec, layer, dir, options);
}

}  // namespace moekit
