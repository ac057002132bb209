// Helpers of the MX tests: tiny MXFP4 (gpt-oss) and MXFP8 (MiniMax-M3 style) checkpoints written
// by the project's own writer (save_checkpoint with expert_format Mxfp4 / Mxfp8) in the real
// tensor names, raw edits of one tensor (any dtype, U8 included), and the dequantisation written
// out here from the OCP MX v1.0 tables, independently of the library.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fp8_test_util.h"
#include "moekit/checkpoint.h"
#include "moekit/dtype.h"
#include "moekit/safetensors.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit::test {

// configs/<model>.json scaled down to H, I, E, with `shared_slots` I-wide shared slots where the
// model has a shared expert, and quantization_config replaced by `quant` (null: the file's own).
inline MoeSpec mx_spec(const std::string& model, int hidden, int inter, int experts,
                       int shared_slots, const nlohmann::json& quant = nullptr) {
  const std::string path = std::string(MOEKIT_TEST_DATA_DIR) + "/../configs/" + model + ".json";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  nlohmann::json top = nlohmann::json::parse(in);
  nlohmann::json& c = top.contains("text_config") ? top["text_config"] : top;
  c["hidden_size"] = hidden;
  c[c.contains("moe_intermediate_size") ? "moe_intermediate_size" : "intermediate_size"] = inter;
  for (const char* key : {"n_routed_experts", "num_experts", "num_local_experts"})
    if (c.contains(key)) c[key] = experts;
  if (c.contains("shared_intermediate_size")) c["shared_intermediate_size"] = shared_slots * inter;
  if (!quant.is_null()) top["quantization_config"] = quant;
  return parse_spec_json(top.dump(), model + "-mx");
}

// MiniMax-M3's config with the MXFP8 quantization_config of a MiniMax-M3-style export.
inline nlohmann::json mxfp8_quant() {
  return {{"quant_method", "mxfp8"},
          {"fmt", "e4m3"},
          {"weight_block_size", {1, 32}},
          {"activation_scheme", "dynamic"},
          {"modules_to_not_convert", {"gate", "e_score_correction_bias", "lm_head"}}};
}

inline void write_mx_checkpoint(const MoeSpec& spec, int layer, uint64_t seed, ExpertFormat f,
                                bool stacked, const std::string& dir) {
  const auto w = make_random_weights(spec, layer, seed);
  SaveCheckpointOptions o;
  o.expert_format = f;
  o.stacked = stacked;
  save_checkpoint(*w, dir, o);
}

// ---- the dequantisation, from the OCP MX v1.0 tables

// FP4 E2M1 by magnitude code (OCP MX v1.0, §5.3.3).
inline float e2m1_decode(uint8_t code) {
  static const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = magnitude[code & 7];
  return (code & 8) ? -v : v;
}
// E8M0: 2^(s - 127); 255 is NaN.
inline double e8m0_decode(uint8_t s) { return s == 255 ? NAN : std::pow(2.0, int(s) - 127); }

// bf16(element x scale) of rows x cols, q rows of cols/2 (mxfp4) or cols (mxfp8) bytes, scale
// rows of cols/32 bytes.
inline std::vector<Bf16> mx_dequantise(ExpertFormat f, const uint8_t* q, const uint8_t* scale,
                                       size_t rows, size_t cols) {
  const bool fp4 = f == ExpertFormat::Mxfp4;
  std::vector<Bf16> out(rows * cols);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      const double v = fp4 ? e2m1_decode((q[r * cols / 2 + c / 2] >> (4 * (c % 2))) & 15)
                           : e4m3_decode(q[r * cols + c]);
      out[r * cols + c] = float_to_bf16(static_cast<float>(v * e8m0_decode(scale[r * cols / 32 + c / 32])));
    }
  }
  return out;
}

// ---- raw tensors (any dtype the file holds, U8 included)

struct RawTensor {
  std::string dtype;  // safetensors spelling
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  bool keep = true;
  std::string rename;  // non-empty: write under this name
};

inline RawTensor raw_tensor(const std::string& dir, const std::string& tensor) {
  SafetensorsFile f(file_of(dir, tensor));
  const auto& info = f.info(tensor);
  const uint8_t* p = static_cast<const uint8_t*>(f.raw_data(tensor));
  return {info.dtype_name, info.shape, std::vector<uint8_t>(p, p + info.nbytes())};
}

// Rewrites the file holding `tensor`, letting edit change its dtype, shape, bytes or name (or
// drop it). Every other tensor is copied unchanged; a rename is written into the index too.
inline void edit_raw(const std::string& dir, const std::string& tensor,
                     const std::function<void(RawTensor&)>& edit) {
  const std::string path = file_of(dir, tensor);
  std::map<std::string, RawTensor> all;
  {
    SafetensorsFile f(path);
    ASSERT_TRUE(f.contains(tensor)) << tensor;
    for (const auto& n : f.names()) all[n] = raw_tensor(dir, n);
  }
  edit(all[tensor]);
  std::map<std::string, SafetensorsWriteTensor> out;
  std::map<std::string, std::string> integers;
  for (auto& [n, t] : all) {
    if (!t.keep) continue;
    const std::string name = t.rename.empty() ? n : t.rename;
    const bool integer = t.dtype == "U8" || t.dtype == "I8";
    out[name] = {integer ? DType::BF16 : parse_dtype(t.dtype), t.shape,
                 {t.bytes.data(), t.bytes.size()}};
    if (integer) integers[name] = t.dtype;
  }
  write_safetensors(path, out, {}, integers);
  const RawTensor& t = all[tensor];
  if (!t.rename.empty()) {
    const std::string index = dir + "/model.safetensors.index.json";
    nlohmann::json j = nlohmann::json::parse(std::ifstream(index));
    j["weight_map"][t.rename] = j["weight_map"][tensor];
    j["weight_map"].erase(tensor);
    std::ofstream(index) << j.dump(2);
  }
}

}  // namespace moekit::test
