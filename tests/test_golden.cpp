// Golden checks: moekit's CPU reference against the models' public reference code.
//
// tests/golden/<case>/ holds what scripts/golden/make_golden.py wrote by running the MoE block of
// transformers 5.17 (DeepseekV3MoE, Qwen2MoeSparseMoeBlock, GptOssMLP, ...) in float32 on a
// shrunk copy of the model's published config.json:
//   config.json        the family's real config format, tiny sizes; layer L is an MoE layer
//   model.safetensors  layer L's MoE weights under the published checkpoint names (checked by the
//                      script to load bit-exact through transformers' own from_pretrained)
//   io.safetensors     x [T,H] bf16, y [T,H] f32 (the block output), expert_ids [T,k] i32 and
//                      expert_weights [T,k] f32 (ascending ids; routed scaling folded in);
//                      metadata "layer" = L
// Each case runs the whole moekit path a user runs: load_spec(dir) -> load_checkpoint_weights ->
// cpu_reference::forward, unfused and (where the spec allows) fused, and must reproduce y to
// max|d| / max|y| <= 1e-4 (both sides use the same bf16 weights; torch accumulates in fp32, the
// reference in double) and pick the same experts with the same weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "moekit/dtype.h"
#include "moekit/layer.h"
#include "moekit/safetensors.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

namespace fs = std::filesystem;

constexpr double kMaxRelDiff = 1e-4;     // max |y_moekit - y_torch| / max |y_torch|
constexpr double kWeightRelDiff = 1e-5;  // routing weights, relative to the token's largest

// Every case make_golden.py writes; a directory not listed here (or a listed one missing) fails
// GoldenDirectories.EveryCaseIsChecked, so a new case cannot be silently skipped.
const std::vector<std::string> kCases = {
    "deepseek_v2",  "deepseek_v2_lite", "deepseek_v3", "deepseek_v4",       "glm4_moe",
    "glm_moe_dsa",  "gpt_oss",          "kimi_k2",     "minimax_m2",        "minimax_m3",
    "mixtral",      "qwen2_moe",        "qwen3_moe",   "qwen3_moe_stacked",
};

std::string golden_root() { return std::string(MOEKIT_TEST_DATA_DIR) + "/golden"; }

struct GoldenIo {
  int layer = -1;
  int tokens = 0;
  int hidden = 0;
  int top_k = 0;
  std::vector<Bf16> x;
  std::vector<float> y;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Reads a tensor of the expected dtype and rank into a vector (memcpy: the file gives no
// alignment guarantee beyond what the writer chose).
template <typename T>
std::vector<T> read_tensor(const SafetensorsFile& f, const std::string& name,
                           const std::string& dtype_name, std::vector<int64_t>* shape) {
  const SafetensorsTensorInfo& info = f.info(name);
  EXPECT_EQ(info.dtype_name, dtype_name) << name << " in " << f.path();
  *shape = info.shape;
  std::vector<T> out(info.nbytes() / sizeof(T));
  EXPECT_EQ(out.size() * sizeof(T), info.nbytes()) << name;
  std::memcpy(out.data(), f.raw_data(name), info.nbytes());
  return out;
}

GoldenIo read_io(const std::string& dir) {
  SafetensorsFile f(dir + "/io.safetensors");
  GoldenIo io;
  const auto& meta = f.metadata();
  auto it = meta.find("layer");
  EXPECT_NE(it, meta.end()) << "io.safetensors of " << dir << " has no 'layer' metadata";
  if (it != meta.end()) io.layer = std::stoi(it->second);

  std::vector<int64_t> shape;
  io.x = read_tensor<Bf16>(f, "x", "BF16", &shape);
  EXPECT_EQ(shape.size(), 2u);
  io.tokens = static_cast<int>(shape.at(0));
  io.hidden = static_cast<int>(shape.at(1));
  io.y = read_tensor<float>(f, "y", "F32", &shape);
  EXPECT_EQ(shape, (std::vector<int64_t>{io.tokens, io.hidden}));
  io.ids = read_tensor<int32_t>(f, "expert_ids", "I32", &shape);
  EXPECT_EQ(shape.size(), 2u);
  io.top_k = static_cast<int>(shape.at(1));
  io.weights = read_tensor<float>(f, "expert_weights", "F32", &shape);
  EXPECT_EQ(shape, (std::vector<int64_t>{io.tokens, io.top_k}));
  return io;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float a : v) m = std::max(m, std::fabs(static_cast<double>(a)));
  return m;
}

// max |a - b| / max |ref|, and where the largest difference is.
std::pair<double, size_t> max_rel_diff(const std::vector<float>& got,
                                       const std::vector<float>& ref) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (d > worst) worst = d, at = i;
  }
  return {worst / std::max(max_abs(ref), 1e-30), at};
}

// The routed experts of each token (the first top_k slots; fused shared slots come after) must be
// the golden ones, with the same weights.
void expect_same_routing(const Routing& r, const GoldenIo& io) {
  ASSERT_EQ(r.tokens, io.tokens);
  ASSERT_GE(r.slots, io.top_k);
  for (int t = 0; t < io.tokens; ++t) {
    std::vector<std::pair<int32_t, float>> got;
    for (int j = 0; j < io.top_k; ++j)
      got.emplace_back(r.ids[t * r.slots + j], r.weights[t * r.slots + j]);
    std::sort(got.begin(), got.end());
    float wmax = 0;
    for (int j = 0; j < io.top_k; ++j)
      wmax = std::max(wmax, std::fabs(io.weights[t * io.top_k + j]));
    for (int j = 0; j < io.top_k; ++j) {
      const int32_t want_id = io.ids[t * io.top_k + j];
      const float want_w = io.weights[t * io.top_k + j];
      EXPECT_EQ(got[j].first, want_id) << "token " << t << " routed slot " << j;
      EXPECT_NEAR(got[j].second, want_w, kWeightRelDiff * wmax)
          << "token " << t << " expert " << want_id;
    }
  }
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, CpuReferenceMatchesTransformers) {
  const std::string dir = golden_root() + "/" + GetParam();
  ASSERT_TRUE(fs::exists(dir + "/config.json")) << dir;
  const GoldenIo io = read_io(dir);
  ASSERT_GE(io.layer, 0);

  const MoeSpec spec = load_spec(dir);
  ASSERT_TRUE(spec.is_moe_layer(io.layer)) << "layer " << io.layer << " of " << dir;
  ASSERT_EQ(spec.hidden, io.hidden);
  ASSERT_EQ(spec.top_k, io.top_k);

  const auto weights = load_checkpoint_weights(spec, io.layer, dir);
  ASSERT_NE(weights, nullptr);

  std::vector<FuseShared> modes = {FuseShared::Off};
  if (spec.can_fuse_shared()) modes.push_back(FuseShared::On);
  for (FuseShared mode : modes) {
    SCOPED_TRACE(std::string("fuse_shared=") + fuse_shared_name(mode));
    const ForwardResult out = cpu_reference::forward(*weights, io.x.data(), io.tokens, mode);
    ASSERT_EQ(out.y.size(), io.y.size());
    expect_same_routing(out.routing, io);
    const auto [rel, at] = max_rel_diff(out.y, io.y);
    EXPECT_LE(rel, kMaxRelDiff) << GetParam() << ": max |d| / max |y| = " << rel << " at token "
                                << at / io.hidden << " column " << at % io.hidden << " (moekit "
                                << out.y[at] << ", transformers " << io.y[at] << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Golden, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param; });

TEST(GoldenDirectories, EveryCaseIsChecked) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(golden_root()))
    if (entry.is_directory()) found.push_back(entry.path().filename().string());
  std::sort(found.begin(), found.end());
  std::vector<std::string> expected = kCases;
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(found, expected) << "tests/golden/ and kCases in " << __FILE__ << " disagree";
}

}  // namespace
}  // namespace moekit
