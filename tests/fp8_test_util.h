// Helpers of the fp8 tests: tiny fp8 block-scale checkpoints written by the project's own writer
// (save_checkpoint with F8_E4M3 experts) in the real tensor names, edits of one tensor in them,
// and the dequantisation written out independently of the library.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moekit/checkpoint.h"
#include "moekit/dtype.h"
#include "moekit/safetensors.h"
#include "moekit/weights.h"

namespace moekit::test {

// Random weights of `spec` saved as an fp8 checkpoint in dir (per-expert or stacked names).
inline void write_fp8_checkpoint(const MoeSpec& spec, int layer, uint64_t seed, bool stacked,
                                 const std::string& dir) {
  const auto w = make_random_weights(spec, layer, seed);
  SaveCheckpointOptions o;
  o.expert_dtype = DType::F8_E4M3;
  o.stacked = stacked;
  save_checkpoint(*w, dir, o);
}

// The file of dir that holds `tensor` (from model.safetensors.index.json).
inline std::string file_of(const std::string& dir, const std::string& tensor) {
  std::ifstream in(dir + "/model.safetensors.index.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_TRUE(j["weight_map"].contains(tensor)) << tensor;
  return dir + "/" + j["weight_map"].value(tensor, std::string());
}

// A tensor's bytes, as stored.
inline std::vector<uint8_t> tensor_bytes(const std::string& dir, const std::string& tensor) {
  SafetensorsFile f(file_of(dir, tensor));
  const uint8_t* p = static_cast<const uint8_t*>(f.raw_data(tensor));
  return std::vector<uint8_t>(p, p + f.info(tensor).nbytes());
}

inline std::vector<float> tensor_f32(const std::string& dir, const std::string& tensor) {
  const std::vector<uint8_t> b = tensor_bytes(dir, tensor);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

// Rewrites the file holding `tensor`, letting edit change its dtype, shape and bytes (or drop it:
// set keep = false). Every other tensor is copied unchanged.
struct TensorEdit {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  bool keep = true;
};
inline void edit_tensor(const std::string& dir, const std::string& tensor,
                        const std::function<void(TensorEdit&)>& edit) {
  const std::string path = file_of(dir, tensor);
  std::map<std::string, TensorEdit> all;
  {
    SafetensorsFile f(path);
    ASSERT_TRUE(f.contains(tensor)) << tensor;
    for (const auto& n : f.names()) {
      const uint8_t* d = static_cast<const uint8_t*>(f.raw_data(n));
      all[n] = {f.dtype(n), f.shape(n), std::vector<uint8_t>(d, d + f.info(n).nbytes())};
    }
  }
  edit(all[tensor]);
  std::map<std::string, SafetensorsWriteTensor> out;
  for (auto& [n, t] : all)
    if (t.keep) out[n] = {t.dtype, t.shape, {t.bytes.data(), t.bytes.size()}};
  write_safetensors(path, out);
}

// Sets fp32 element i of a tensor to v.
inline void set_f32(const std::string& dir, const std::string& tensor, size_t i, float v) {
  edit_tensor(dir, tensor, [&](TensorEdit& t) { std::memcpy(t.bytes.data() + 4 * i, &v, 4); });
}

// bf16(fp8(q[r][c]) * scale[r/128][c/128]) of a [rows, cols] matrix whose scale grid has
// scale_cols columns: the dequantisation, written out here from the e4m3 bit layout.
inline float e4m3_decode(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 15, mant = b & 7;
  const float v = exp == 0 ? std::ldexp(float(mant), -9) : std::ldexp(float(8 | mant), exp - 10);
  return sign ? -v : v;
}
inline std::vector<Bf16> dequantise(const uint8_t* q, const float* scale, size_t rows,
                                    size_t cols) {
  const size_t scale_cols = (cols + 127) / 128;
  std::vector<Bf16> out(rows * cols);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c)
      out[r * cols + c] =
          float_to_bf16(e4m3_decode(q[r * cols + c]) * scale[(r / 128) * scale_cols + c / 128]);
  return out;
}

inline bool same_bits(const Bf16* a, const Bf16* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (a[i].bits != b[i].bits) return false;
  return true;
}

}  // namespace moekit::test
