// Test helpers shared by the layer tests (reference, fast CPU): a real config.json scaled down to a
// few experts and a small hidden size, parsed by the real parser, and deterministic inputs.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/random_values.h"
#include "moekit/dtype.h"
#include "moekit/spec.h"

namespace moekit::test {

// configs/<model>.json scaled down to H = hidden, E = experts, I = inter; the shared width keeps
// its number of I-wide slots (Qwen2-57B: 8, DeepSeek-V2-Lite: 2); groups and top-k are untouched.
inline MoeSpec shrunk_spec(const std::string& model, int hidden, int inter, int experts) {
  const std::string path = std::string(MOEKIT_TEST_DATA_DIR) + "/../configs/" + model + ".json";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json top = nlohmann::json::parse(text.str());
  nlohmann::json& c = top.contains("text_config") ? top["text_config"] : top;
  c["hidden_size"] = hidden;
  const char* inter_key =
      c.contains("moe_intermediate_size") ? "moe_intermediate_size" : "intermediate_size";
  const int orig_inter = c[inter_key].get<int>();
  c[inter_key] = inter;
  for (const char* key : {"n_routed_experts", "num_experts", "num_local_experts"})
    if (c.contains(key)) c[key] = experts;
  for (const char* key : {"shared_expert_intermediate_size", "shared_intermediate_size"}) {
    if (c.contains(key) && c[key].get<int>() > 0) {
      const int width = c[key].get<int>();
      EXPECT_EQ(width % orig_inter, 0) << model << " " << key;
      c[key] = width / orig_inter * inter;
    }
  }
  return parse_spec_json(top.dump(), model + "-shrunk");
}

// x[tokens, hidden] = scale * U(-1, 1), bf16, a function of the seed only.
inline std::vector<Bf16> random_input(int tokens, int hidden, uint64_t seed, float scale) {
  namespace rv = random_values;
  std::vector<Bf16> x(static_cast<size_t>(tokens) * hidden);
  const uint64_t s = rv::stream_key(seed, 0, rv::Tensor::Input, -1);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(scale * rv::uniform(s, i));
  return x;
}

}  // namespace moekit::test
