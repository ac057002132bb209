// quantization_config parsing (quant_config.h).
//
// transformers' FineGrainedFP8Config reads quant_method, activation_scheme (only "dynamic"),
// weight_block_size (default (128, 128)), modules_to_not_convert and, for DeepSeek-V3.1+,
// scale_fmt; it ignores fmt. "mxfp4" (gpt-oss) has no keys moekit needs; "mxfp8" is read as
// vLLM's Mxfp8Config reads it, plus weight_block_size, which must be the MX block [1, 32]. moekit checks fmt too, since e4m3 is what its kernels decode: the
// spellings the published configs use ("e4m3", MiniMax-M2's "float8_e4m3fn") are accepted, any
// other (e5m2) is an error rather than garbage weights.
#include "spec/quant_config.h"

#include <optional>
#include <string>
#include <vector>

#include "common/json_safe.h"
#include "moekit/error.h"

namespace moekit {

const char* quant_kind_name(QuantKind k) {
  switch (k) {
    case QuantKind::None:
      return "none";
    case QuantKind::Fp8Block:
      return "fp8-block";
    case QuantKind::Mxfp4:
      return "mxfp4";
    case QuantKind::Mxfp8:
      return "mxfp8";
  }
  return "?";
}

namespace spec_internal {
namespace {

using nlohmann::json;

constexpr int kFp8BlockSize = 128;
constexpr int kMxBlockSize = 32;

bool present(const json& obj, const char* key) {
  return obj.contains(key) && !obj.at(key).is_null();
}

std::string string_key(const json& q, const char* key, const std::string& fallback,
                       const std::string& name) {
  if (!present(q, key)) return fallback;
  const json& v = q.at(key);
  MK_CHECK(v.is_string(), "config '" << name << "': quantization_config." << key
                                     << " must be a string, got " << describe_json(v));
  return v.get<std::string>();
}

std::vector<std::string> string_list(const json& q, const char* key, const std::string& name) {
  std::vector<std::string> out;
  if (!present(q, key)) return out;
  const json& v = q.at(key);
  MK_CHECK(v.is_array(), "config '" << name << "': quantization_config." << key
                                    << " must be a list of strings, got " << describe_json(v));
  for (const json& e : v) {
    MK_CHECK(e.is_string(), "config '" << name << "': quantization_config." << key
                                       << " holds a non-string " << describe_json(e));
    out.push_back(e.get<std::string>());
  }
  return out;
}

void read_fp8(const json& q, const std::string& name, QuantSpec& out) {
  const std::string fmt = string_key(q, "fmt", "e4m3", name);
  MK_CHECK(fmt == "e4m3" || fmt == "float8_e4m3fn",
           "config '" << name << "': quantization_config.fmt = '" << fmt
                      << "' is not supported (expected e4m3 or float8_e4m3fn)");

  out.block_out = out.block_in = kFp8BlockSize;
  if (present(q, "weight_block_size")) {
    const json& b = q.at("weight_block_size");
    std::optional<int> r, c;
    if (b.is_array() && b.size() == 2) {
      r = json_as_int(b[0]);
      c = json_as_int(b[1]);
    }
    MK_CHECK(r && c, "config '" << name << "': quantization_config.weight_block_size must be a "
                                << "list of two integers [out, in], got " << describe_json(b));
    MK_CHECK(*r == kFp8BlockSize && *c == kFp8BlockSize,
             "config '" << name << "': quantization_config.weight_block_size = [" << *r << ", "
                        << *c << "] is not supported (expected [128, 128])");
  }

  out.activation_scheme = string_key(q, "activation_scheme", "dynamic", name);
  MK_CHECK(out.activation_scheme == "dynamic",
           "config '" << name << "': quantization_config.activation_scheme = '"
                      << out.activation_scheme << "' is not supported (expected dynamic)");

  const std::string scale_fmt = string_key(q, "scale_fmt", "", name);
  MK_CHECK(scale_fmt.empty() || scale_fmt == "ue8m0",
           "config '" << name << "': quantization_config.scale_fmt = '" << scale_fmt
                      << "' is not supported (expected ue8m0, or no scale_fmt for fp32 scales)");
  out.scale_ue8m0 = scale_fmt == "ue8m0";
}

// quant_method "mxfp8" (MiniMax-M3 style; vLLM's Mxfp8Config): e4m3 weights, weight_block_size
// [1, 32] (the default: the OCP MX block), activation_scheme "dynamic" (the only one vLLM takes;
// moekit runs the weights-only W8A16 form of it, docs/decisions/mx_experts.md).
void read_mxfp8(const json& q, const std::string& name, QuantSpec& out) {
  const std::string fmt = string_key(q, "fmt", "e4m3", name);
  MK_CHECK(fmt == "e4m3" || fmt == "float8_e4m3fn",
           "config '" << name << "': quantization_config.fmt = '" << fmt
                      << "' is not supported for mxfp8 (expected e4m3 or float8_e4m3fn)");
  out.block_out = 1;
  out.block_in = kMxBlockSize;
  if (present(q, "weight_block_size")) {
    const json& b = q.at("weight_block_size");
    std::optional<int> r, c;
    if (b.is_array() && b.size() == 2) {
      r = json_as_int(b[0]);
      c = json_as_int(b[1]);
    }
    MK_CHECK(r && c, "config '" << name << "': quantization_config.weight_block_size must be a "
                                << "list of two integers [out, in], got " << describe_json(b));
    MK_CHECK(*r == 1 && *c == kMxBlockSize,
             "config '" << name << "': quantization_config.weight_block_size = [" << *r << ", "
                        << *c << "] is not supported for mxfp8 (expected [1, 32])");
  }
  out.activation_scheme = string_key(q, "activation_scheme", "dynamic", name);
  MK_CHECK(out.activation_scheme == "dynamic",
           "config '" << name << "': quantization_config.activation_scheme = '"
                      << out.activation_scheme << "' is not supported (expected dynamic)");
}

}  // namespace

QuantSpec parse_quant_config(const json& top, const json& text, const std::string& name) {
  QuantSpec out;
  const json* q = nullptr;
  if (present(top, "quantization_config"))
    q = &top.at("quantization_config");
  else if (present(text, "quantization_config"))
    q = &text.at("quantization_config");
  if (q == nullptr) return out;
  MK_CHECK(q->is_object(), "config '" << name << "': quantization_config must be an object, got "
                                      << describe_json(*q));
  MK_CHECK(present(*q, "quant_method"),
           "config '" << name << "': quantization_config has no 'quant_method'");
  const std::string method = string_key(*q, "quant_method", "", name);
  if (method == "fp8") {
    out.kind = QuantKind::Fp8Block;
    read_fp8(*q, name, out);
  } else if (method == "mxfp4") {
    out.kind = QuantKind::Mxfp4;
    out.block_out = 1;
    out.block_in = kMxBlockSize;
  } else if (method == "mxfp8") {
    out.kind = QuantKind::Mxfp8;
    read_mxfp8(*q, name, out);
  } else {
    MK_FAIL("config '" << name << "': quantization_config.quant_method = '" << method
                       << "' is not supported (expected fp8, mxfp4 or mxfp8)");
  }
  out.modules_to_not_convert = string_list(*q, "modules_to_not_convert", name);
  return out;
}

}  // namespace spec_internal
}  // namespace moekit
