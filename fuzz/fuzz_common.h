// Shared by the fuzz targets and the seed generator: tiny model specs made from the shipped
// configs (every family's real config.json with the sizes shrunk, parsed by the real parser), and
// a scratch file per fuzzing process.
//
// Why tiny: a fuzz iteration should cost microseconds, so a checkpoint of one MoE layer must be a
// few kB. H = I = 32 keeps gpt-oss's MXFP4 form (blocks of 32) and one 128x128 fp8 block legal.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/spec.h"

namespace moekit::fuzz {

// The families whose checkpoint names differ (DESIGN.md §5 and include/moekit/checkpoint.h).
inline const std::vector<std::string>& checkpoint_models() {
  static const std::vector<std::string> kModels = {
      "deepseek-v3", "qwen2-57b-a14b",    "mixtral-8x7b", "minimax-m3",
      "minimax-m2",  "deepseek-v4-flash", "gpt-oss-120b", "qwen3-30b-a3b"};
  return kModels;
}

// configs/<model>.json shrunk to H = I = 32, E = 4, k = 2, 2 groups of which 1 is kept (where the
// model groups its experts), shared width = I (Qwen2: 2I, two fused slots).
inline MoeSpec tiny_spec(const std::string& model) {
  const std::string path = config_dir() + "/" + model + ".json";
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "fuzz: cannot open %s\n", path.c_str());
    std::abort();
  }
  nlohmann::json top = nlohmann::json::parse(in);
  nlohmann::json& c = top.contains("text_config") ? top["text_config"] : top;
  c["hidden_size"] = 32;
  for (const char* k : {"n_routed_experts", "num_experts", "num_local_experts"})
    if (c.contains(k)) c[k] = 4;
  if (c.contains("moe_intermediate_size"))
    c["moe_intermediate_size"] = 32;
  else
    c["intermediate_size"] = 32;
  if (c.contains("shared_expert_intermediate_size")) c["shared_expert_intermediate_size"] = 64;
  if (c.contains("shared_intermediate_size") && c["shared_intermediate_size"].get<int>() > 0)
    c["shared_intermediate_size"] = 32;
  for (const char* k : {"num_experts_per_tok", "experts_per_token"})
    if (c.contains(k)) c[k] = 2;
  if (c.contains("n_group") && c["n_group"].is_number_integer() && c["n_group"].get<int>() > 1) {
    c["n_group"] = 2;
    c["topk_group"] = 1;
  }
  return parse_spec_json(top.dump(), model + "-tiny");
}

// A file name private to this process (libFuzzer -fork / -jobs run several processes at once).
// In /dev/shm when there is one: every iteration writes a file, and a disk write costs more than
// the parsing it feeds.
inline std::string scratch_path(const std::string& tag) {
  const std::filesystem::path base = std::filesystem::is_directory("/dev/shm")
                                         ? std::filesystem::path("/dev/shm")
                                         : std::filesystem::temp_directory_path();
  const auto dir = base / ("moekit_fuzz_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  // Removed at exit (libFuzzer ends with exit(), also after -max_total_time).
  static std::vector<std::filesystem::path> made;
  if (made.empty())
    std::atexit([] {
      std::error_code ec;
      for (const auto& d : made) std::filesystem::remove_all(d, ec);
    });
  made.push_back(dir);
  return dir.string();
}

inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace moekit::fuzz
