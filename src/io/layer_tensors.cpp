// Finding and checking one layer's checkpoint tensors (layer_tensors.h).
#include "io/layer_tensors.h"

#include "io/tensor_convert.h"
#include "moekit/checkpoint.h"
#include "moekit/error.h"

namespace moekit::io {
namespace {

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

}  // namespace

TensorRef LayerTensors::require(const std::string& rel, const std::vector<int64_t>& shape,
                                const std::string& what, int expert) {
  const std::string name = full(rel, expert);
  TensorRef t = dir_.find(name);
  MK_CHECK(t, "checkpoint " << dir_.path() << " has no tensor '" << name << "' (" << what
                            << " of layer " << layer_ << " of " << spec_.name << ", "
                            << checkpoint_naming_name(s_.naming) << " naming)");
  MK_CHECK(t.shape() == shape, "checkpoint tensor " << t.where() << ": expected shape "
                                                    << shape_str(shape) << " (" << what << "), got "
                                                    << shape_str(t.shape()));
  return t;
}

TensorRef LayerTensors::require_float(const std::string& rel, const std::vector<int64_t>& shape,
                                      const std::string& what) {
  TensorRef t = require(rel, shape, what);
  const auto& info = *t.info;
  MK_CHECK(info.dtype_supported && info.dtype != DType::F8_E4M3,
           "checkpoint tensor " << t.where() << " (" << what << "): expected dtype BF16, F16 or "
                                << "F32, got " << info.dtype_name);
  return t;
}

TensorRef LayerTensors::require_u8(const std::string& rel, const std::vector<int64_t>& shape,
                                   const std::string& what) {
  TensorRef t = require(rel, shape, what);
  MK_CHECK(t.info->dtype_name == "U8", "checkpoint tensor " << t.where() << " (" << what
                                                            << "): expected dtype U8, got "
                                                            << t.info->dtype_name);
  return t;
}

MatrixSrc LayerTensors::matrix(const std::string& rel, size_t rows, size_t cols,
                               const std::string& what, int expert, int stack, int index) {
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
                          cols % kMxBlock == 0 && m.w.shape() == with(rows, cols / 2);
  if (packed_fp4) {
    m.fp4 = true;
    m.offset = static_cast<size_t>(index) * rows * cols / 2;
    m.scale = find_scale(m.w, with(rows, cols / kMxBlock), what, "1x32 blocks");
    m.scale_offset = static_cast<size_t>(index) * rows * (cols / kMxBlock);
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
    MK_CHECK(cols % kMxBlock == 0, "checkpoint tensor "
                                       << m.w.where() << " (" << what << "): rows of " << cols
                                       << " columns are not a whole number of 32-element mxfp8 "
                                       << "blocks (quantization_config.weight_block_size [1, 32])");
    m.mx8 = true;
    m.scale = find_mx_scale(m.w, with(rows, cols / kMxBlock), what);
    m.scale_offset = static_cast<size_t>(index) * rows * (cols / kMxBlock);
  } else if (m.dtype == DType::F8_E4M3) {
    const size_t rb = ceil_div(rows, kFp8Block), kb = ceil_div(cols, kFp8Block);
    m.scale = find_scale(m.w, with(rb, kb), what, "128x128 blocks");
    m.scale_offset = static_cast<size_t>(index) * rb * kb;
  }
  return m;
}

TensorRef LayerTensors::find_mx_scale(const TensorRef& w, const std::vector<int64_t>& shape,
                                      const std::string& what) {
  const std::vector<std::string> candidates = mx_scale_names(w.name());
  TensorRef scale;
  for (const std::string& sn : candidates) {
    if ((scale = dir_.find(sn))) break;
  }
  MK_CHECK(scale, "checkpoint tensor " << w.where() << " (" << what
                                       << ") is F8_E4M3 in an mxfp8 checkpoint but has no e8m0 "
                                       << "scale: tried " << quoted_list(candidates));
  MK_CHECK(scale.shape() == shape,
           "checkpoint tensor " << scale.where() << " (mxfp8 scale of " << what
                                << "): expected shape " << shape_str(shape)
                                << " (one per 1x32 block), got " << shape_str(scale.shape()));
  const std::string& d = scale.info->dtype_name;
  MK_CHECK(d == "U8" || d == "F8_E8M0",
           "checkpoint tensor " << scale.where() << " (mxfp8 scale of " << what
                                << "): expected dtype U8 or F8_E8M0 (e8m0 exponent bytes), got "
                                << d);
  return scale;
}

TensorRef LayerTensors::find_scale(const TensorRef& w, const std::vector<int64_t>& shape,
                                   const std::string& what, const char* blocks) {
  const std::vector<std::string> candidates = scale_names(w.name());
  TensorRef scale;
  for (const std::string& sn : candidates) {
    if ((scale = dir_.find(sn))) break;
  }
  MK_CHECK(scale, "checkpoint tensor " << w.where() << " (" << what << ") is " << w.info->dtype_name
                                       << " but has no block scale: tried "
                                       << quoted_list(candidates));
  MK_CHECK(scale.shape() == shape, "checkpoint tensor " << scale.where() << " (block scale of "
                                                        << what << "): expected shape "
                                                        << shape_str(shape) << " (" << blocks
                                                        << "), got " << shape_str(scale.shape()));
  MK_CHECK(is_scale_dtype(scale.info->dtype_name),
           "checkpoint tensor " << scale.where() << " (block scale of " << what
                                << "): expected dtype F32, BF16, F16 or F8_E8M0, got "
                                << scale.info->dtype_name);
  return scale;
}

LayerTensors resolve_layer_tensors(CheckpointDir& dir, const MoeSpec& spec, int layer) {
  std::vector<CheckpointNaming> order = {checkpoint_naming_for(spec)};
  for (CheckpointNaming n :
       {CheckpointNaming::HfMlp, CheckpointNaming::Qwen2Moe, CheckpointNaming::Mixtral,
        CheckpointNaming::MiniMax, CheckpointNaming::DeepSeekV4, CheckpointNaming::GptOss}) {
    if (n != order[0]) order.push_back(n);
  }
  std::vector<std::string> tried;
  for (CheckpointNaming n : order) {
    for (const std::string& block : block_candidates(n)) {
      NameScheme s = name_scheme(n, block);
      for (const std::string& p : layer_prefix_candidates()) {
        const std::string prefix = expand(p, layer);
        if (dir.has(prefix + s.router)) return LayerTensors(dir, spec, layer, s, prefix);
        if (n == order[0]) tried.push_back(prefix + s.router);
      }
    }
  }
  const std::string layer_fragment = "layers." + std::to_string(layer) + ".";
  std::vector<std::string> seen = dir.names_like(layer_fragment, 6);
  if (seen.empty()) seen = dir.names_like("", 6);
  MK_FAIL("checkpoint " << dir.path() << " has no router for layer " << layer << " of " << spec.name
                        << ": tried " << quoted_list(tried)
                        << " and the other families' names; it holds " << dir.tensor_count()
                        << " tensors, e.g. " << quoted_list(seen));
}

}  // namespace moekit::io
