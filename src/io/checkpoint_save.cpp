// save_checkpoint: one layer of LayerWeights written under a family's published names (see
// include/moekit/checkpoint.h), plus model.safetensors.index.json so several layers (or files)
// form one checkpoint directory that load_checkpoint_weights and the transformers loaders read.
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/checkpoint_names.h"
#include "io/mx_experts.h"
#include "io/tensor_convert.h"
#include "moekit/checkpoint.h"
#include "moekit/error.h"
#include "moekit/safetensors.h"

namespace moekit {
namespace {

namespace fs = std::filesystem;

// Owns the bytes of the tensors being written (deque: stable addresses as it grows).
class TensorSet {
 public:
  // pow2_scales: fp8 tile scales rounded up to powers of two (a config with scale_fmt ue8m0)
  TensorSet(CheckpointNaming naming, DType expert_dtype, bool mxfp8, bool pow2_scales)
      : naming_(naming), expert_dtype_(expert_dtype), mxfp8_(mxfp8), pow2_scales_(pow2_scales) {}

  std::vector<uint8_t>& add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            size_t bytes) {
    MK_CHECK(!tensors_.count(name), "save_checkpoint: tensor '" << name << "' written twice");
    buffers_.emplace_back(bytes);
    std::vector<uint8_t>& b = buffers_.back();
    tensors_[name] = {dtype, std::move(shape), std::span<const uint8_t>(b.data(), b.size())};
    return b;
  }

  void add_f32(const std::string& name, std::vector<int64_t> shape, const float* v, size_t n) {
    std::memcpy(add(name, DType::F32, std::move(shape), n * 4).data(), v, n * 4);
  }

  // `count` matrices [rows, cols] from src (contiguous), in the expert dtype; shape is the full
  // tensor shape ([rows, cols] or [count, rows, cols]). F8 adds the 128x128 block scale tensor.
  void add_weight(const std::string& name, std::vector<int64_t> shape, const Bf16* src,
                  size_t count, size_t rows, size_t cols) {
    const size_t n = count * rows * cols;
    if (mxfp8_) {
      std::vector<int64_t> sshape = shape;
      sshape.back() = static_cast<int64_t>(cols / kMxGroup);
      auto& q = add(name, DType::F8_E4M3, std::move(shape), n);
      auto& s = add(name + "_scale", DType::F8_E4M3, std::move(sshape), n / kMxGroup);
      u8_[name + "_scale"] = "U8";
      for (size_t r = 0; r < count * rows; ++r)
        io::mx_quantize_row(ExpertFormat::Mxfp8, src + r * cols, cols, q.data() + r * cols,
                            s.data() + r * (cols / kMxGroup));
      return;
    }
    switch (expert_dtype_) {
      case DType::BF16:
        std::memcpy(add(name, DType::BF16, std::move(shape), n * 2).data(), src, n * 2);
        return;
      case DType::F32: {
        auto& b = add(name, DType::F32, std::move(shape), n * 4);
        for (size_t i = 0; i < n; ++i) {
          const float f = bf16_to_float(src[i]);
          std::memcpy(b.data() + 4 * i, &f, 4);
        }
        return;
      }
      case DType::F16: {
        auto& b = add(name, DType::F16, std::move(shape), n * 2);
        for (size_t i = 0; i < n; ++i) {
          const uint16_t h = float_to_f16(bf16_to_float(src[i]));
          std::memcpy(b.data() + 2 * i, &h, 2);
        }
        return;
      }
      case DType::F8_E4M3: {
        const size_t rb = io::ceil_div(rows, io::kFp8Block), kb = io::ceil_div(cols, io::kFp8Block);
        std::vector<int64_t> sshape;
        if (shape.size() == 3) sshape.push_back(static_cast<int64_t>(count));
        sshape.push_back(static_cast<int64_t>(rb));
        sshape.push_back(static_cast<int64_t>(kb));
        auto& q = add(name, DType::F8_E4M3, std::move(shape), n);
        const std::string scale_name =
            io::scale_names(name).at(naming_ == CheckpointNaming::DeepSeekV4 ? 1 : 0);
        auto& s = add(scale_name, DType::F32, std::move(sshape), count * rb * kb * 4);
        for (size_t m = 0; m < count; ++m) {
          io::quantize_fp8_block(src + m * rows * cols, rows, cols, q.data() + m * rows * cols,
                                 reinterpret_cast<float*>(s.data()) + m * rb * kb, pow2_scales_);
        }
        return;
      }
    }
  }

  // gpt-oss MXFP4: `experts` matrices [rows, cols] as _blocks [E, rows, cols/32, 16] and
  // _scales [E, rows, cols/32] (U8); row_of(e, r) gives checkpoint row r of expert e's matrix.
  template <typename RowOf>
  void add_mxfp4(const std::string& base, size_t experts, size_t rows, size_t cols,
                 RowOf row_of) {
    const int64_t e64 = experts, r64 = rows, g64 = cols / kMxGroup;
    auto& q = add(base + "_blocks", DType::F8_E4M3, {e64, r64, g64, 16}, experts * rows * cols / 2);
    auto& s = add(base + "_scales", DType::F8_E4M3, {e64, r64, g64}, experts * rows * g64);
    u8_[base + "_blocks"] = "U8";
    u8_[base + "_scales"] = "U8";
    for (size_t e = 0; e < experts; ++e) {
      for (size_t r = 0; r < rows; ++r) {
        const size_t at = e * rows + r;
        io::mx_quantize_row(ExpertFormat::Mxfp4, row_of(e, r), cols, q.data() + at * cols / 2,
                            s.data() + at * g64);
      }
    }
  }

  const std::map<std::string, SafetensorsWriteTensor>& tensors() const { return tensors_; }
  // Tensors whose bytes are U8 (written with the U8 dtype name; DType has no U8).
  const std::map<std::string, std::string>& u8() const { return u8_; }

 private:
  CheckpointNaming naming_;
  DType expert_dtype_;
  bool mxfp8_;
  bool pow2_scales_;
  std::map<std::string, std::string> u8_;
  std::deque<std::vector<uint8_t>> buffers_;
  std::map<std::string, SafetensorsWriteTensor> tensors_;
};

// Adds `entries` (tensor -> file) to dir/model.safetensors.index.json.
void merge_index(const std::string& dir, const std::string& file,
                 const std::map<std::string, SafetensorsWriteTensor>& tensors) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  nlohmann::json j = nlohmann::json::object();
  if (fs::exists(index)) {
    std::ifstream in(index);
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      MK_FAIL("cannot merge into checkpoint index " << index.string() << ": not valid JSON ("
                                                    << e.what() << ")");
    }
    MK_CHECK(j.is_object(),
             "cannot merge into checkpoint index " << index.string() << ": not a JSON object");
  }
  uint64_t total = 0;
  if (j.contains("metadata") && j["metadata"].is_object() && j["metadata"].contains("total_size") &&
      j["metadata"]["total_size"].is_number_unsigned())
    total = j["metadata"]["total_size"].get<uint64_t>();
  for (const auto& [name, t] : tensors) {
    j["weight_map"][name] = file;
    total += t.bytes.size();
  }
  j["metadata"]["total_size"] = total;
  std::ofstream out(index, std::ios::trunc);
  out << j.dump(2) << "\n";
  MK_CHECK(out, "cannot write checkpoint index " << index.string());
}

}  // namespace

std::string save_checkpoint(const LayerWeights& w, const std::string& dir,
                            CheckpointNaming naming) {
  SaveCheckpointOptions o;
  o.naming = naming;
  return save_checkpoint(w, dir, o);
}

std::string save_checkpoint(const LayerWeights& w, const std::string& dir,
                            const SaveCheckpointOptions& o) {
  const MoeSpec& spec = w.spec();
  const int L = w.layer();
  const CheckpointNaming naming =
      o.naming == CheckpointNaming::Auto ? checkpoint_naming_for(spec) : o.naming;
  const io::NameScheme s = io::name_scheme(naming);
  const std::string p = io::expand(
      o.layer_prefix.empty() ? io::default_layer_prefix(naming, spec) : o.layer_prefix, L);
  const size_t E = spec.num_experts, H = spec.hidden, I = spec.expert_intermediate;
  const size_t Is = spec.shared_intermediate;
  const int64_t e64 = E, h64 = H, i64 = I, is64 = Is;
  const bool fp8 = o.expert_dtype == DType::F8_E4M3 || o.expert_format == ExpertFormat::Fp8Block;
  const bool mxfp4 = o.expert_format == ExpertFormat::Mxfp4;
  const bool mxfp8 = o.expert_format == ExpertFormat::Mxfp8;
  MK_CHECK(!fp8 || !s.interleaved,
           "save_checkpoint: the gpt-oss naming has no fp8 block-scale form; use BF16, F16 or F32");
  MK_CHECK(!(mxfp4 || mxfp8) || o.expert_dtype == DType::BF16,
           "save_checkpoint: expert format " << expert_format_name(o.expert_format)
                                             << " quantises the bf16 weights; expert_dtype must be "
                                             << "BF16, got " << dtype_name(o.expert_dtype));
  MK_CHECK(!mxfp4 || s.interleaved,
           "save_checkpoint: mxfp4 is written in gpt-oss's _blocks / _scales form only; naming "
               << checkpoint_naming_name(naming) << " has none (use mxfp8)");
  MK_CHECK(!mxfp8 || !s.interleaved,
           "save_checkpoint: the gpt-oss naming publishes mxfp4, not mxfp8");
  MK_CHECK(!(mxfp4 || mxfp8) || (H % kMxGroup == 0 && I % kMxGroup == 0 && Is % kMxGroup == 0),
           "save_checkpoint: " << expert_format_name(o.expert_format)
                               << " needs H, I and the shared width divisible by 32, got H = " << H
                               << ", I = " << I << ", Is = " << Is);
  MK_CHECK(w.expert_format() == ExpertFormat::Bf16,
           "save_checkpoint: the weights of " << w.origin() << " are held in "
                                              << expert_format_name(w.expert_format())
                                              << "; load them with expert format bf16 to save");
  TensorSet out(naming, fp8 ? DType::F8_E4M3 : o.expert_dtype, mxfp8, spec.quant.scale_ue8m0);

  // Router (in the weights' router dtype), Qwen2's shared gate row apart.
  const size_t rsize = dtype_size(w.router_dtype());
  const uint8_t* router = static_cast<const uint8_t*>(w.router_weight());
  std::memcpy(out.add(p + s.router, w.router_dtype(), {e64, h64}, E * H * rsize).data(), router,
              E * H * rsize);
  if (spec.shared_kind == SharedKind::Gated) {
    MK_CHECK(!s.shared_expert_gate.empty(),
             "save_checkpoint: naming " << checkpoint_naming_name(naming)
                                        << " has no shared-expert gate for spec " << spec.name);
    std::memcpy(out.add(p + s.shared_expert_gate, w.router_dtype(), {1, h64}, H * rsize).data(),
                router + E * H * rsize, H * rsize);
  }
  if (w.correction_bias()) {
    MK_CHECK(!s.correction_bias.empty(), "save_checkpoint: naming "
                                             << checkpoint_naming_name(naming)
                                             << " has no correction bias for spec " << spec.name);
    out.add_f32(p + s.correction_bias, {e64}, w.correction_bias(), E);
  }
  if (w.router_bias()) {
    MK_CHECK(!s.router_bias.empty(),
             "save_checkpoint: naming " << checkpoint_naming_name(naming) << " has no router bias");
    out.add_f32(p + s.router_bias, {e64}, w.router_bias(), E);
  }

  // Routed experts.
  if (mxfp4) {
    // gpt-oss MXFP4: gate_up rows interleaved (row 2i gate i, row 2i+1 up i) along H; down
    // rows h along I: the [E, 2I, H] / [E, H, I] matrices before transformers' transpose.
    std::vector<ExpertView> x(E);
    for (size_t e = 0; e < E; ++e) x[e] = w.expert(static_cast<int>(e));
    out.add_mxfp4(p + s.stacked_gate_up, E, 2 * I, H, [&](size_t e, size_t r) {
      return x[e].w13 + ((r % 2 ? I : 0) + r / 2) * H;
    });
    out.add_mxfp4(p + s.stacked_down, E, H, I, [&](size_t e, size_t r) {
      return x[e].w2 + r * I;
    });
    if (spec.has_expert_bias) {
      std::vector<float> gub(E * 2 * I), db(E * H);
      for (size_t e = 0; e < E; ++e) {
        for (size_t i = 0; i < I && x[e].b13; ++i) {
          gub[e * 2 * I + 2 * i] = x[e].b13[i];
          gub[e * 2 * I + 2 * i + 1] = x[e].b13[I + i];
        }
        for (size_t h = 0; h < H && x[e].b2; ++h) db[e * H + h] = x[e].b2[h];
      }
      out.add_f32(p + s.stacked_gate_up_bias, {e64, 2 * i64}, gub.data(), gub.size());
      out.add_f32(p + s.stacked_down_bias, {e64, h64}, db.data(), db.size());
    }
  } else if (s.interleaved) {
    // gpt-oss: gate_up [E, H, 2I] with gate in even columns, down [E, I, H] (x . W layout).
    std::vector<Bf16> gu(E * H * 2 * I), dn(E * I * H);
    std::vector<float> gub(E * 2 * I), db(E * H);
    for (size_t e = 0; e < E; ++e) {
      const ExpertView x = w.expert(static_cast<int>(e));
      for (size_t h = 0; h < H; ++h) {
        for (size_t i = 0; i < I; ++i) {
          gu[(e * H + h) * 2 * I + 2 * i] = x.w13[i * H + h];
          gu[(e * H + h) * 2 * I + 2 * i + 1] = x.w13[(I + i) * H + h];
          dn[(e * I + i) * H + h] = x.w2[h * I + i];
        }
      }
      for (size_t i = 0; i < I && x.b13; ++i) {
        gub[e * 2 * I + 2 * i] = x.b13[i];
        gub[e * 2 * I + 2 * i + 1] = x.b13[I + i];
      }
      for (size_t h = 0; h < H && x.b2; ++h) db[e * H + h] = x.b2[h];
    }
    out.add_weight(p + s.stacked_gate_up, {e64, h64, 2 * i64}, gu.data(), 1, E * H, 2 * I);
    out.add_weight(p + s.stacked_down, {e64, i64, h64}, dn.data(), 1, E * I, H);
    if (spec.has_expert_bias) {
      out.add_f32(p + s.stacked_gate_up_bias, {e64, 2 * i64}, gub.data(), gub.size());
      out.add_f32(p + s.stacked_down_bias, {e64, h64}, db.data(), db.size());
    }
  } else if (o.stacked) {
    std::vector<Bf16> gu(E * 2 * I * H), dn(E * H * I);
    for (size_t e = 0; e < E; ++e) {
      const ExpertView x = w.expert(static_cast<int>(e));
      std::copy(x.w13, x.w13 + 2 * I * H, gu.begin() + e * 2 * I * H);
      std::copy(x.w2, x.w2 + H * I, dn.begin() + e * H * I);
    }
    out.add_weight(p + s.stacked_gate_up, {e64, 2 * i64, h64}, gu.data(), E, 2 * I, H);
    out.add_weight(p + s.stacked_down, {e64, h64, i64}, dn.data(), E, H, I);
  } else {
    for (size_t e = 0; e < E; ++e) {
      const int ei = static_cast<int>(e);
      const ExpertView x = w.expert(ei);
      out.add_weight(p + io::expand(s.expert_gate, L, ei), {i64, h64}, x.w13, 1, I, H);
      out.add_weight(p + io::expand(s.expert_up, L, ei), {i64, h64}, x.w13 + I * H, 1, I, H);
      out.add_weight(p + io::expand(s.expert_down, L, ei), {h64, i64}, x.w2, 1, H, I);
    }
  }

  // Shared MLP.
  if (w.shared_w13()) {
    MK_CHECK(!s.shared_gate.empty(), "save_checkpoint: naming " << checkpoint_naming_name(naming)
                                                                << " has no shared-expert names "
                                                                   "for spec "
                                                                << spec.name);
    out.add_weight(p + s.shared_gate, {is64, h64}, w.shared_w13(), 1, Is, H);
    out.add_weight(p + s.shared_up, {is64, h64}, w.shared_w13() + Is * H, 1, Is, H);
    out.add_weight(p + s.shared_down, {h64, is64}, w.shared_w2(), 1, H, Is);
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  MK_CHECK(!ec, "cannot create checkpoint directory " << dir << ": " << ec.message());
  const std::string file =
      o.file_name.empty() ? "model-layer-" + std::to_string(L) + ".safetensors" : o.file_name;
  const std::string path = (fs::path(dir) / file).string();
  write_safetensors(path, out.tensors(),
                    {{"format", "pt"},
                     {"moekit_origin", w.origin()},
                     {"moekit_naming", checkpoint_naming_name(naming)}},
                    out.u8());
  merge_index(dir, file, out.tensors());
  return path;
}

}  // namespace moekit
