// Helpers shared by the weights, safetensors, checkpoint and bad-input tests: the real configs as
// JSON, scaled-down specs made from them (configs/<model>.json with the sizes shrunk, then parsed
// like any config), and per-test scratch directories.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/safetensors.h"
#include "moekit/spec.h"

namespace moekit::test {

struct SmallSizes {
  int hidden = 64;
  int experts = 16;
  int inter = 32;
  int shared_multiple = 2;  // Qwen2-style shared width = multiple * inter; DeepSeek keeps its count
};

// configs/<model>.json as a JSON value.
inline nlohmann::json model_config(const std::string& model) {
  std::ifstream in(std::string(MOEKIT_TEST_DATA_DIR) + "/../configs/" + model + ".json");
  EXPECT_TRUE(in) << model;
  return nlohmann::json::parse(in);
}

// configs/<model>.json with hidden / experts / intermediate sizes shrunk, parsed by the real
// parser; everything else (family, scoring, shared kind, layer list) stays the model's own.
inline MoeSpec small_spec(const std::string& model, SmallSizes z = {}) {
  const std::string path = std::string(MOEKIT_TEST_DATA_DIR) + "/../configs/" + model + ".json";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  nlohmann::json top = nlohmann::json::parse(in);
  nlohmann::json& c = top.contains("text_config") ? top["text_config"] : top;
  c["hidden_size"] = z.hidden;
  for (const char* k : {"n_routed_experts", "num_experts", "num_local_experts"})
    if (c.contains(k)) c[k] = z.experts;
  const bool has_moe_inter = c.contains("moe_intermediate_size");
  if (has_moe_inter)
    c["moe_intermediate_size"] = z.inter;
  else
    c["intermediate_size"] = z.inter;
  if (c.contains("shared_expert_intermediate_size"))
    c["shared_expert_intermediate_size"] = z.shared_multiple * z.inter;
  if (c.contains("shared_intermediate_size")) c["shared_intermediate_size"] = z.inter;
  if (c.contains("num_experts_per_tok") && c["num_experts_per_tok"].get<int>() > z.experts)
    c["num_experts_per_tok"] = z.experts;
  if (c.contains("n_group") && c["n_group"].is_number_integer() &&
      c["n_group"].get<int>() > z.experts / 2) {
    c["n_group"] = 1;
    c["topk_group"] = 1;
  }
  return parse_spec_json(top.dump(), model + "-small");
}

// A later MoE layer of the spec, the checkpoint tests' layer (DeepSeek-V4's first
// num_hash_layers are hash-routed).
inline int test_layer(const MoeSpec& s) {
  return s.moe_layers.at(std::min<size_t>(s.moe_layers.size() - 1, 3));
}

// A fresh, empty directory under the system temp dir, named after the running test.
inline std::string scratch_dir(const std::string& tag = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string("moekit_") + info->test_suite_name() + "_" + info->name() + tag;
  for (char& ch : name)
    if (ch == '/') ch = '_';
  const auto dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline std::string expand_layer(std::string pattern, int layer) {
  const auto at = pattern.find("{L}");
  if (at != std::string::npos) pattern.replace(at, 3, std::to_string(layer));
  return pattern;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Replaces every occurrence of `from` by `to` (same length, so a safetensors header keeps its
// length and offsets) inside the header of a safetensors file.
inline void replace_in_file(const std::string& path, const std::string& from,
                            const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string bytes = read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(bytes[i]);
  int count = 0;
  for (size_t at = bytes.find(from, 8); at != std::string::npos && at < 8 + n;
       at = bytes.find(from, at + to.size())) {
    bytes.replace(at, from.size(), to);
    ++count;
  }
  ASSERT_GT(count, 0) << "'" << from << "' not in the header of " << path;
  write_file(path, bytes);
}

// Replaces the dtype text of one tensor's header entry (same length).
inline void replace_tensor_dtype(const std::string& path, const std::string& tensor,
                                 const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string bytes = read_file(path);
  const size_t entry = bytes.find("\"" + tensor + "\":{");
  ASSERT_NE(entry, std::string::npos) << tensor;
  const size_t at = bytes.find("\"dtype\":" + from, entry);
  ASSERT_NE(at, std::string::npos) << tensor;
  bytes.replace(at + 8, from.size(), to);
  write_file(path, bytes);
}

// Renames a tensor by rewriting the file (moekit dtypes only).
inline void rename_tensor(const std::string& path, const std::string& from, const std::string& to) {
  std::map<std::string, SafetensorsWriteTensor> t;
  std::vector<std::vector<uint8_t>> store;
  {
    SafetensorsFile f(path);
    ASSERT_TRUE(f.contains(from)) << from;
    store.reserve(f.names().size());
    for (const auto& n : f.names()) {
      const uint8_t* d = static_cast<const uint8_t*>(f.data(n));
      store.emplace_back(d, d + f.info(n).nbytes());
      t[n == from ? to : n] = {f.dtype(n), f.shape(n), {store.back().data(), store.back().size()}};
    }
  }
  write_safetensors(path, t);
}

}  // namespace moekit::test
