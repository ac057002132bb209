// The bad-input catalogue, API arguments: forward(), route(), the weights' expert lookup, the
// switch parsers and the host-memory check, called with arguments they must refuse. Both CPU
// backends (reference and fast) refuse the same inputs with the same words; an empty problem
// (zero tokens) is not an error.
#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "expect_error.h"
#include "io_test_util.h"
#include "moekit/cpu_fast.h"
#include "moekit/dtype.h"
#include "moekit/layer.h"
#include "moekit/routing.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

using nlohmann::json;
using test::expect_error;
using test::model_config;
using test::small_spec;

class BadApi : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = small_spec("deepseek-v3");
    w_ = make_random_weights(spec_, spec_.moe_layers.front(), 3);
    x_.assign(static_cast<size_t>(4) * spec_.hidden, float_to_bf16(0.5f));
  }
  // Both CPU backends must refuse the same inputs with the same words.
  void expect_both(const std::function<void(bool fast)>& call, const std::vector<std::string>& f) {
    SCOPED_TRACE("reference");
    expect_error([&] { call(false); }, f);
    SCOPED_TRACE("fast");
    expect_error([&] { call(true); }, f);
  }
  ForwardResult forward(bool fast, const LayerWeights& w, const Bf16* x, int tokens,
                        FuseShared fuse) {
    return fast ? cpu_fast::forward(w, x, tokens, fuse)
                : cpu_reference::forward(w, x, tokens, fuse);
  }

  MoeSpec spec_;
  std::unique_ptr<LayerWeights> w_;
  std::vector<Bf16> x_;
};

TEST_F(BadApi, NegativeTokens) {
  expect_both([&](bool fast) { forward(fast, *w_, x_.data(), -1, FuseShared::Auto); },
              {"expected tokens >= 0", "got tokens -1"});
}

TEST_F(BadApi, ZeroTokensIsAnEmptyProblemNotAnError) {
  for (bool fast : {false, true}) {
    const ForwardResult r = forward(fast, *w_, nullptr, 0, FuseShared::Auto);
    EXPECT_EQ(r.tokens, 0);
    EXPECT_TRUE(r.y.empty());
    EXPECT_TRUE(r.routing.ids.empty());
  }
  EXPECT_EQ(w_->materialised_experts(), 0);  // nothing routed, nothing built
}

TEST_F(BadApi, NullInput) {
  expect_both([&](bool fast) { forward(fast, *w_, nullptr, 2, FuseShared::Auto); },
              {"input x is null for 2 tokens"});
}

TEST_F(BadApi, NanInput) {
  x_[1 * spec_.hidden + 5] = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  expect_both([&](bool fast) { forward(fast, *w_, x_.data(), 4, FuseShared::Auto); },
              {"non-finite input at token 1, column 5: nan"});
}

TEST_F(BadApi, InfInput) {
  x_[3 * spec_.hidden + 63] = float_to_bf16(-std::numeric_limits<float>::infinity());
  expect_both([&](bool fast) { forward(fast, *w_, x_.data(), 4, FuseShared::Off); },
              {"non-finite input at token 3, column 63: -inf"});
}

TEST_F(BadApi, FuseOnWithoutSharedExpert) {
  const MoeSpec s = small_spec("mixtral-8x7b");
  const auto w = make_random_weights(s, 0, 1);
  expect_both([&](bool fast) { forward(fast, *w, x_.data(), 1, FuseShared::On); },
              {"cannot fuse the shared expert of mixtral-8x7b-small"});
}

TEST_F(BadApi, FuseOnWithPartialSharedWidth) {
  test::SmallSizes z;
  const MoeSpec s0 = small_spec("qwen2-57b-a14b", z);
  json c = model_config("qwen2-57b-a14b");
  c["hidden_size"] = z.hidden;
  c["num_experts"] = z.experts;
  c["moe_intermediate_size"] = z.inter;
  c["shared_expert_intermediate_size"] = z.inter + z.inter / 2;  // 1.5 slots
  const MoeSpec s = parse_spec_json(c.dump(), "qwen2-partial");
  const auto w = make_random_weights(s, s.moe_layers.front(), 1);
  expect_both([&](bool fast) { forward(fast, *w, x_.data(), 1, FuseShared::On); },
              {"cannot fuse the shared expert of qwen2-partial", "shared_intermediate (48)",
               "expert_intermediate (32)"});
  EXPECT_GT(s0.shared_slots(), 0);
  // Auto falls back to the unfused shared MLP instead of failing.
  EXPECT_FALSE(cpu_reference::forward(*w, x_.data(), 1, FuseShared::Auto).fused);
}

TEST_F(BadApi, ExpertIdOutOfRange) {
  const int rows = spec_.weight_rows(true);  // 16 routed + 1 fused shared slot
  EXPECT_NO_THROW(w_->expert(rows - 1));
  expect_error([&] { w_->expert(rows); },
               {"expert index out of range: expected 0 <= e < 17, got 17"});
  expect_error([&] { w_->expert(-1); }, {"expected 0 <= e < 17, got -1"});
}

TEST_F(BadApi, DenseLayerWeights) {
  expect_error([&] { make_random_weights(spec_, 0, 1); },
               {"layer 0 of deepseek-v3-small is not an MoE layer"});
}

TEST_F(BadApi, RouteArguments) {
  const RoutingConfig cfg = RoutingConfig::from_spec(spec_, false);
  std::vector<float> logits(cfg.logits_columns, 0.0f);
  expect_error([&] { cpu_reference::route(cfg, logits.data(), -2, w_->correction_bias()); },
               {"expected tokens >= 0, got -2"});
  expect_error([&] { cpu_reference::route(cfg, nullptr, 1, w_->correction_bias()); },
               {"logits is null for 1 tokens"});
  expect_error([&] { cpu_reference::route(cfg, logits.data(), 1, nullptr); },
               {"correction bias but correction_bias is null"});
  logits[7] = std::numeric_limits<float>::infinity();
  expect_error([&] { cpu_reference::route(cfg, logits.data(), 1, w_->correction_bias()); },
               {"router logit of token 0, expert 7 is inf"});
}

TEST_F(BadApi, ParseSwitches) {
  expect_error([] { parse_fuse_shared("yes"); },
               {"unknown fuse_shared mode 'yes' (expected auto, on or off)"});
  expect_error([] { cpu_fast::parse_isa("sse9"); }, {"unknown CPU ISA 'sse9'"});
  expect_error([] { parse_dtype("Q8_0"); }, {"Q8_0"});
}

TEST_F(BadApi, TokenCountBeyondMemoryIsRefusedUpFront) {
  // 4096 experts of H 2^20 x I 2^16: hundreds of GB per expert; the estimate must not overflow
  // and the check must refuse before anything is allocated.
  json c = model_config("mixtral-8x7b");
  c["hidden_size"] = 1 << 20;
  c["num_local_experts"] = 4096;
  c["intermediate_size"] = 1 << 16;
  const MoeSpec s = parse_spec_json(c.dump(), "huge");
  EXPECT_GT(host_bytes_needed(s, 1 << 20, false), size_t{4096} * s.expert_bytes() - 1);
  expect_error([&] { check_host_memory(s, 1 << 20, false); }, {"GB of host memory for huge"});
  expect_error([&] { host_bytes_needed(s, -1, false); }, {"expected tokens >= 0, got -1"});
}

}  // namespace
}  // namespace moekit
