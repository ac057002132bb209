// The scaled-down specs of the GPU layer tests (tests/cuda/), host-only so that the CPU tests of
// the plan (tests/test_plan_instances.cpp) search the same shapes the GPU tests run.
//
// small_spec differs from shrunk_spec.h on purpose: its sizes are the expert kernels' (multiples
// of 64, rows of the widths the kernel instances take: 1.5, 2, 4 KB ...), and a shared expert
// gets a fixed width (2 x inter for Qwen2's gated one, inter for the others) whatever the model's.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moekit/spec.h"

namespace moekit::test {

// The 13 model families of configs/.
inline const std::vector<std::string> kModels = {
    "deepseek-v2-lite", "deepseek-v3",  "deepseek-v4-flash", "glm-4.5",         "glm-5",
    "gpt-oss-120b",     "kimi-k2",      "minimax-m2",        "minimax-m3",      "mixtral-8x7b",
    "qwen2-57b-a14b",   "qwen3-235b-a22b", "qwen3-30b-a3b"};

// configs/<model>.json with the sizes shrunk to kernel-legal multiples of 64, parsed by the real
// parser; family, scoring, groups, shared kind, activation stay the model's own.
inline MoeSpec small_spec(const std::string& model, int hidden = 256, int experts = 32,
                          int inter = 128) {
  const std::string path = config_dir() + "/" + model + ".json";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  nlohmann::json top = nlohmann::json::parse(in);
  nlohmann::json& c = top.contains("text_config") ? top["text_config"] : top;
  c["hidden_size"] = hidden;
  for (const char* k : {"n_routed_experts", "num_experts", "num_local_experts"}) {
    if (c.contains(k)) c[k] = experts;
  }
  if (c.contains("moe_intermediate_size")) {
    c["moe_intermediate_size"] = inter;
  } else {
    c["intermediate_size"] = inter;
  }
  if (c.contains("shared_expert_intermediate_size")) c["shared_expert_intermediate_size"] = 2 * inter;
  if (c.contains("shared_intermediate_size")) c["shared_intermediate_size"] = inter;
  if (c.contains("n_group") && c["n_group"].is_number_integer() &&
      c["n_group"].get<int>() > experts / 2) {
    c["n_group"] = 1;
    c["topk_group"] = 1;
  }
  return parse_spec_json(top.dump(), model + "-small");
}

}  // namespace moekit::test
