// Checkpoints: every family's published names round-trip (save_checkpoint ->
// load_checkpoint_weights gives back the same bits), in per-expert and stacked forms and every
// stored dtype, several layers in one directory, other families' names and prefixes, and the
// names moekit lists. Packed expert formats: test_checkpoint_packed.cpp; malformed checkpoints:
// test_checkpoint_errors.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "io_test_util.h"
#include "moekit/checkpoint.h"
#include "moekit/error.h"
#include "moekit/safetensors.h"
#include "moekit/weights.h"

using moekit::CheckpointNaming;
using moekit::DType;
using moekit::LayerWeights;
using moekit::MoeSpec;
using moekit::SafetensorsFile;
using moekit::SaveCheckpointOptions;
using moekit::test::scratch_dir;
using moekit::test::small_spec;
using moekit::test::test_layer;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

// The router as fp32, whatever its dtype.
std::vector<float> router_f32(const LayerWeights& w) {
  const size_t n = size_t(w.spec().router_columns()) * w.spec().hidden;
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = moekit::load_as_float(w.router_dtype(), w.router_weight(), i);
  return out;
}

// Everything a forward reads is bit-identical, fused slots included.
void expect_same_weights(const LayerWeights& a, const LayerWeights& b) {
  const MoeSpec& s = a.spec();
  const size_t H = s.hidden, I = s.expert_intermediate, Is = s.shared_intermediate;
  ASSERT_EQ(router_f32(a), router_f32(b));
  if (a.router_dtype() == DType::BF16) EXPECT_EQ(b.router_dtype(), DType::BF16);
  for (auto [x, y, n] :
       {std::tuple{a.correction_bias(), b.correction_bias(), size_t(s.num_experts)},
        std::tuple{a.router_bias(), b.router_bias(), size_t(s.num_experts)}}) {
    ASSERT_EQ(x == nullptr, y == nullptr);
    if (x) EXPECT_EQ(std::memcmp(x, y, n * 4), 0);
  }
  ASSERT_EQ(a.shared_w13() == nullptr, b.shared_w13() == nullptr);
  if (a.shared_w13()) {
    EXPECT_EQ(std::memcmp(a.shared_w13(), b.shared_w13(), 2 * Is * H * 2), 0);
    EXPECT_EQ(std::memcmp(a.shared_w2(), b.shared_w2(), H * Is * 2), 0);
  }
  for (int e = 0; e < s.num_experts + s.shared_slots(); ++e) {
    const auto x = a.expert(e), y = b.expert(e);
    ASSERT_EQ(std::memcmp(x.w13, y.w13, 2 * I * H * 2), 0) << "expert " << e;
    ASSERT_EQ(std::memcmp(x.w2, y.w2, H * I * 2), 0) << "expert " << e;
    ASSERT_EQ(x.b13 == nullptr, y.b13 == nullptr);
    if (x.b13) {
      EXPECT_EQ(std::memcmp(x.b13, y.b13, 2 * I * 4), 0) << "expert " << e;
      EXPECT_EQ(std::memcmp(x.b2, y.b2, H * 4), 0) << "expert " << e;
    }
  }
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    SafetensorsFile f(entry.path().string());
    for (const auto& n : f.names()) out.insert(n);
  }
  return out;
}

struct FamilyCase {
  const char* model;
  const char* naming;
  const char* router_name;  // a published name the saved file must hold, layer 3 (or 4)
};

void PrintTo(const FamilyCase& c, std::ostream* os) { *os << c.model << " (" << c.naming << ")"; }

class CheckpointRoundTrip : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(CheckpointRoundTrip, PerExpertAndStacked) {
  const FamilyCase c = GetParam();
  const MoeSpec spec = small_spec(c.model);
  const int L = test_layer(spec);
  auto w = moekit::make_random_weights(spec, L, 99);
  EXPECT_STREQ(moekit::checkpoint_naming_name(moekit::checkpoint_naming_for(spec)), c.naming);

  const std::string dir = scratch_dir();
  moekit::save_checkpoint(*w, dir, CheckpointNaming::Auto);
  const auto expected_names = moekit::checkpoint_tensor_names(spec, L, CheckpointNaming::Auto);
  EXPECT_EQ(names_in(dir), std::set<std::string>(expected_names.begin(), expected_names.end()));
  EXPECT_TRUE(names_in(dir).count(moekit::test::expand_layer(c.router_name, L)))
      << "published router name " << c.router_name;

  auto loaded = moekit::load_checkpoint_weights(spec, L, dir);
  EXPECT_EQ(loaded->materialised_experts(), 0);
  loaded->prefetch({0, 1, 2, 3, 4, 5, 6, 7});  // concurrent first use
  EXPECT_EQ(loaded->materialised_experts(), 8);
  EXPECT_THAT(loaded->origin(), HasSubstr(std::string(c.naming) + " naming"));
  expect_same_weights(*w, *loaded);
  EXPECT_EQ(loaded->materialised_experts(), spec.num_experts + spec.shared_slots());

  if (spec.model_type != "gpt_oss") {
    const std::string sdir = scratch_dir("_stacked");
    SaveCheckpointOptions o;
    o.stacked = true;
    moekit::save_checkpoint(*w, sdir, o);
    auto stacked = moekit::load_checkpoint_weights(spec, L, sdir);
    EXPECT_THAT(stacked->origin(), HasSubstr("stacked experts"));
    expect_same_weights(*w, *stacked);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, CheckpointRoundTrip,
    ::testing::Values(
        FamilyCase{"deepseek-v3", "hf-mlp", "model.layers.{L}.mlp.gate.e_score_correction_bias"},
        FamilyCase{"deepseek-v2-lite", "hf-mlp",
                   "model.layers.{L}.mlp.shared_experts.up_proj.weight"},
        FamilyCase{"kimi-k2", "hf-mlp", "model.layers.{L}.mlp.experts.7.down_proj.weight"},
        FamilyCase{"glm-4.5", "hf-mlp", "model.layers.{L}.mlp.gate.weight"},
        FamilyCase{"glm-5", "hf-mlp", "model.layers.{L}.mlp.shared_experts.gate_proj.weight"},
        FamilyCase{"qwen3-30b-a3b", "hf-mlp", "model.layers.{L}.mlp.experts.0.gate_proj.weight"},
        FamilyCase{"qwen2-57b-a14b", "qwen2-moe", "model.layers.{L}.mlp.shared_expert_gate.weight"},
        FamilyCase{"mixtral-8x7b", "mixtral",
                   "model.layers.{L}.block_sparse_moe.experts.3.w3.weight"},
        FamilyCase{"minimax-m2", "minimax",
                   "model.layers.{L}.block_sparse_moe.e_score_correction_bias"},
        FamilyCase{
            "minimax-m3", "minimax",
            "language_model.model.layers.{L}.block_sparse_moe.shared_experts.down_proj.weight"},
        FamilyCase{"deepseek-v4-flash", "deepseek-v4", "layers.{L}.ffn.gate.bias"},
        FamilyCase{"gpt-oss-120b", "gpt-oss", "model.layers.{L}.mlp.experts.gate_up_proj_bias"}),
    [](const auto& info) {
      std::string n = info.param.model;
      for (char& ch : n)
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

TEST(Checkpoint, Fp32RouterStaysFp32AndBf16RouterWidensExactly) {
  const MoeSpec m2 = small_spec("minimax-m2");
  auto w = moekit::make_random_weights(m2, test_layer(m2), 1);
  const std::string dir = scratch_dir();
  moekit::save_checkpoint(*w, dir, CheckpointNaming::Auto);
  SafetensorsFile f(dir + "/model-layer-" + std::to_string(test_layer(m2)) + ".safetensors");
  EXPECT_EQ(f.dtype(moekit::test::expand_layer("model.layers.{L}.block_sparse_moe.gate.weight",
                                               test_layer(m2))),
            DType::F32);
  auto loaded = moekit::load_checkpoint_weights(m2, test_layer(m2), dir);
  EXPECT_EQ(loaded->router_dtype(), DType::F32);

  // A bf16 checkpoint router under a spec that asks for fp32 is widened, not rounded.
  const MoeSpec q = small_spec("qwen3-30b-a3b");
  auto wq = moekit::make_random_weights(q, test_layer(q), 2);
  const std::string qdir = scratch_dir("_q");
  moekit::save_checkpoint(*wq, qdir, CheckpointNaming::Auto);
  MoeSpec q32 = q;
  q32.router_dtype = DType::F32;
  auto lq = moekit::load_checkpoint_weights(q32, test_layer(q), qdir);
  EXPECT_EQ(lq->router_dtype(), DType::F32);
  EXPECT_EQ(router_f32(*lq), router_f32(*wq));
}

TEST(Checkpoint, ExpertDtypesConvertToBf16) {
  const MoeSpec spec = small_spec("deepseek-v3", {.hidden = 192, .experts = 4, .inter = 160});
  const int L = test_layer(spec);
  auto w = moekit::make_random_weights(spec, L, 5);
  const size_t H = spec.hidden, I = spec.expert_intermediate;

  // F32 holds every bf16 exactly.
  {
    const std::string dir = scratch_dir("_f32");
    SaveCheckpointOptions o;
    o.expert_dtype = DType::F32;
    moekit::save_checkpoint(*w, dir, o);
    expect_same_weights(*w, *moekit::load_checkpoint_weights(spec, L, dir));
  }
  // F16: the value is bf16(f16(x)).
  {
    const std::string dir = scratch_dir("_f16");
    SaveCheckpointOptions o;
    o.expert_dtype = DType::F16;
    moekit::save_checkpoint(*w, dir, o);
    auto l = moekit::load_checkpoint_weights(spec, L, dir);
    const auto x = w->expert(2), y = l->expert(2);
    for (size_t i = 0; i < 2 * I * H; ++i) {
      const float want = moekit::round_to_bf16(
          moekit::f16_to_float(moekit::float_to_f16(moekit::bf16_to_float(x.w13[i]))));
      ASSERT_EQ(moekit::bf16_to_float(y.w13[i]), want) << i;
    }
  }
  // F8_E4M3 with 128x128 block scales, under both published scale names: the value is
  // bf16(fp8 * scale[r/128][c/128]); 160 and 192 are not multiples of 128 (partial blocks).
  for (CheckpointNaming naming : {CheckpointNaming::HfMlp, CheckpointNaming::DeepSeekV4}) {
    SCOPED_TRACE(moekit::checkpoint_naming_name(naming));
    const std::string dir = scratch_dir(moekit::checkpoint_naming_name(naming));
    SaveCheckpointOptions o;
    o.expert_dtype = DType::F8_E4M3;
    o.naming = naming;
    const std::string file = moekit::save_checkpoint(*w, dir, o);
    auto l = moekit::load_checkpoint_weights(spec, L, dir);
    SafetensorsFile f(file);
    const std::string base = naming == CheckpointNaming::HfMlp
                                 ? "model.layers." + std::to_string(L) + ".mlp.experts.1.up_proj"
                                 : "layers." + std::to_string(L) + ".ffn.experts.1.w3";
    const std::string scale_name =
        naming == CheckpointNaming::HfMlp ? base + ".weight_scale_inv" : base + ".scale";
    ASSERT_EQ(f.shape(scale_name), (std::vector<int64_t>{2, 2}));
    const uint8_t* q = static_cast<const uint8_t*>(f.data(base + ".weight"));
    const float* sc = static_cast<const float*>(f.data(scale_name));
    const auto orig = w->expert(1), got = l->expert(1);
    double max_rel = 0;
    for (size_t r = 0; r < I; ++r) {
      for (size_t c = 0; c < H; ++c) {
        const float want = moekit::round_to_bf16(moekit::fp8_e4m3_to_float(q[r * H + c]) *
                                                 sc[(r / 128) * 2 + c / 128]);
        ASSERT_EQ(moekit::bf16_to_float(got.w13[(I + r) * H + c]), want) << r << "," << c;
        const float o_val = moekit::bf16_to_float(orig.w13[(I + r) * H + c]);
        max_rel = std::max(max_rel, double(std::fabs(want - o_val)) / (std::fabs(o_val) + 1e-2));
      }
    }
    EXPECT_LT(max_rel, 0.1);  // fp8 keeps ~2 significant digits of the original
  }
}

TEST(Checkpoint, SeveralLayersInOneIndexedDirectoryAndWithoutIndex) {
  const MoeSpec spec = small_spec("deepseek-v3");
  const int L1 = spec.moe_layers.at(0), L2 = spec.moe_layers.at(1);
  auto w1 = moekit::make_random_weights(spec, L1, 3);
  auto w2 = moekit::make_random_weights(spec, L2, 3);
  const std::string dir = scratch_dir();
  moekit::save_checkpoint(*w1, dir, CheckpointNaming::Auto);
  moekit::save_checkpoint(*w2, dir, CheckpointNaming::Auto);
  std::ifstream in(dir + "/model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  EXPECT_EQ(index["weight_map"]["model.layers." + std::to_string(L2) + ".mlp.gate.weight"],
            "model-layer-" + std::to_string(L2) + ".safetensors");
  expect_same_weights(*w1, *moekit::load_checkpoint_weights(spec, L1, dir));
  expect_same_weights(*w2, *moekit::load_checkpoint_weights(spec, L2, dir));
  fs::remove(dir + "/model.safetensors.index.json");
  expect_same_weights(*w2, *moekit::load_checkpoint_weights(spec, L2, dir));
  // A single file works as a checkpoint path too.
  expect_same_weights(*w1,
                      *moekit::load_checkpoint_weights(
                          spec, L1, dir + "/model-layer-" + std::to_string(L1) + ".safetensors"));
}

TEST(Checkpoint, OtherFamiliesNamesAndPrefixesAreFound) {
  // Qwen3 weights saved under Mixtral's names and a VL-style prefix still load.
  const MoeSpec spec = small_spec("qwen3-30b-a3b");
  const int L = test_layer(spec);
  auto w = moekit::make_random_weights(spec, L, 8);
  const std::string dir = scratch_dir();
  SaveCheckpointOptions o;
  o.naming = CheckpointNaming::Mixtral;
  o.layer_prefix = "model.language_model.layers.{L}.";
  moekit::save_checkpoint(*w, dir, o);
  auto l = moekit::load_checkpoint_weights(spec, L, dir);
  EXPECT_THAT(l->origin(), HasSubstr("mixtral naming"));
  expect_same_weights(*w, *l);
}

TEST(CheckpointNames, ParseAndList) {
  for (const char* n :
       {"auto", "hf-mlp", "qwen2-moe", "mixtral", "minimax", "deepseek-v4", "gpt-oss"})
    EXPECT_STREQ(moekit::checkpoint_naming_name(moekit::parse_checkpoint_naming(n)), n);
  try {
    moekit::parse_checkpoint_naming("llama");
    FAIL();
  } catch (const moekit::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown checkpoint naming 'llama'"));
  }
  const MoeSpec spec = small_spec("qwen2-57b-a14b");
  const auto stacked = moekit::checkpoint_tensor_names(spec, 2, CheckpointNaming::Auto, true);
  EXPECT_EQ(stacked, (std::vector<std::string>{"model.layers.2.mlp.gate.weight",
                                               "model.layers.2.mlp.experts.gate_up_proj",
                                               "model.layers.2.mlp.experts.down_proj",
                                               "model.layers.2.mlp.shared_expert.gate_proj.weight",
                                               "model.layers.2.mlp.shared_expert.up_proj.weight",
                                               "model.layers.2.mlp.shared_expert.down_proj.weight",
                                               "model.layers.2.mlp.shared_expert_gate.weight"}));
  const auto per_expert =
      moekit::checkpoint_tensor_names(small_spec("mixtral-8x7b"), 0, CheckpointNaming::Auto);
  ASSERT_EQ(per_expert.size(), 1u + 3 * 16);
  EXPECT_EQ(per_expert[1], "model.layers.0.block_sparse_moe.experts.0.w1.weight");
  EXPECT_EQ(per_expert[2], "model.layers.0.block_sparse_moe.experts.0.w3.weight");
  EXPECT_EQ(per_expert[3], "model.layers.0.block_sparse_moe.experts.0.w2.weight");
  try {
    moekit::checkpoint_tensor_names(spec, 2, CheckpointNaming::Mixtral);
    FAIL();
  } catch (const moekit::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("naming mixtral has no shared-expert names"));
  }
}

}  // namespace
