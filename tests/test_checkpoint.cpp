// Checkpoints: every family's published names round-trip (save_checkpoint ->
// load_checkpoint_weights gives back the same bits), in per-expert and stacked forms and every
// stored dtype; gpt-oss's interleaved and MXFP4 layouts decode to moekit's layout; every malformed
// checkpoint is refused naming the tensor, what was expected and what was found.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "expect_error.h"
#include "io/tensor_convert.h"
#include "io_test_util.h"
#include "moekit/checkpoint.h"
#include "moekit/error.h"
#include "moekit/safetensors.h"
#include "moekit/weights.h"

using moekit::Bf16;
using moekit::CheckpointNaming;
using moekit::DType;
using moekit::LayerWeights;
using moekit::MoeSpec;
using moekit::SafetensorsFile;
using moekit::SaveCheckpointOptions;
using moekit::test::scratch_dir;
using moekit::test::small_spec;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

int test_layer(const MoeSpec& s) {
  // A later MoE layer (DeepSeek-V4's first num_hash_layers are hash-routed).
  return s.moe_layers.at(std::min<size_t>(s.moe_layers.size() - 1, 3));
}

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

// ---- gpt-oss MXFP4 (the published gpt-oss checkpoints' expert format) ----

TEST(Checkpoint, GptOssMxfp4DecodesToMoekitLayout) {
  const MoeSpec spec = small_spec("gpt-oss-120b");
  const int L = test_layer(spec);
  const size_t E = spec.num_experts, H = spec.hidden, I = spec.expert_intermediate;
  auto w = moekit::make_random_weights(spec, L, 4);
  const std::string dir = scratch_dir();
  const std::string p = "model.layers." + std::to_string(L) + ".mlp.";
  // Blocks: nibbles and scales from a simple hash; the expected value of element (row, k) is
  // fp4[nibble] * 2^(scale - 127), with element 2b in the low nibble of byte b.
  static const float kFp4[16] = {0,    0.5f,  1,  1.5f,  2,  3,  4,  6,
                                 -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  auto nibble = [](size_t row, size_t k) { return uint8_t((row * 7 + k * 13 + k / 5) % 16); };
  auto scale = [](size_t row, size_t g) { return uint8_t(120 + (row + 3 * g) % 9); };
  auto value = [&](size_t row, size_t k) {
    return kFp4[nibble(row, k)] * std::ldexp(1.0f, int(scale(row, k / 32)) - 127);
  };
  auto blocks = [&](size_t rows, size_t cols, std::vector<uint8_t>& b, std::vector<uint8_t>& s) {
    b.assign(rows * cols / 2, 0);
    s.assign(rows * cols / 32, 0);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t k = 0; k < cols; k += 2)
        b[(r * cols + k) / 2] = uint8_t(nibble(r, k) | (nibble(r, k + 1) << 4));
      for (size_t g = 0; g < cols / 32; ++g) s[r * (cols / 32) + g] = scale(r, g);
    }
  };
  std::vector<uint8_t> gub, gus, dnb, dns;
  blocks(E * 2 * I, H, gub, gus);  // rows: expert-major, then 2I interleaved gate/up rows
  blocks(E * H, I, dnb, dns);
  const int64_t e = E, h = H, i = I;
  std::vector<float> gu_bias(E * 2 * I, 0.25f), dn_bias(E * H, -0.5f);
  std::vector<float> router(E * H, 0.01f), router_bias(E, 0.0f);
  std::map<std::string, moekit::SafetensorsWriteTensor> t;
  // U8 is not a moekit DType: the writer only writes F8_E4M3 (1 byte), then the header is patched.
  t[p + "experts.gate_up_proj_blocks"] = {
      DType::F8_E4M3, {e, 2 * i, h / 32, 16}, moekit::as_bytes_span(gub.data(), gub.size())};
  t[p + "experts.gate_up_proj_scales"] = {
      DType::F8_E4M3, {e, 2 * i, h / 32}, moekit::as_bytes_span(gus.data(), gus.size())};
  t[p + "experts.down_proj_blocks"] = {
      DType::F8_E4M3, {e, h, i / 32, 16}, moekit::as_bytes_span(dnb.data(), dnb.size())};
  t[p + "experts.down_proj_scales"] = {
      DType::F8_E4M3, {e, h, i / 32}, moekit::as_bytes_span(dns.data(), dns.size())};
  t[p + "experts.gate_up_proj_bias"] = {
      DType::F32, {e, 2 * i}, moekit::as_bytes_span(gu_bias.data(), gu_bias.size())};
  t[p + "experts.down_proj_bias"] = {
      DType::F32, {e, h}, moekit::as_bytes_span(dn_bias.data(), dn_bias.size())};
  t[p + "router.weight"] = {
      DType::F32, {e, h}, moekit::as_bytes_span(router.data(), router.size())};
  t[p + "router.bias"] = {
      DType::F32, {e}, moekit::as_bytes_span(router_bias.data(), router_bias.size())};
  const std::string file = dir + "/model.safetensors";
  moekit::write_safetensors(file, t);
  moekit::test::replace_in_file(file, "\"F8_E4M3\"", "\"U8\"     ");  // same length: offsets hold

  auto l = moekit::load_checkpoint_weights(spec, L, dir);
  EXPECT_THAT(l->origin(), HasSubstr("gpt-oss mxfp4 experts"));
  for (size_t ex : {size_t{0}, E - 1}) {
    const auto v = l->expert(int(ex));
    for (size_t r = 0; r < I; ++r) {
      for (size_t c = 0; c < H; ++c) {
        ASSERT_EQ(moekit::bf16_to_float(v.w13[r * H + c]), value(ex * 2 * I + 2 * r, c));
        ASSERT_EQ(moekit::bf16_to_float(v.w13[(I + r) * H + c]), value(ex * 2 * I + 2 * r + 1, c));
      }
    }
    for (size_t hh = 0; hh < H; ++hh)
      for (size_t r = 0; r < I; ++r)
        ASSERT_EQ(moekit::bf16_to_float(v.w2[hh * I + r]), value(ex * H + hh, r));
    EXPECT_EQ(v.b13[0], 0.25f);
    EXPECT_EQ(v.b2[H - 1], -0.5f);
  }
}

// ---- malformed checkpoints ----

using moekit::test::expect_error;

// Saves a small Qwen3-MoE layer, then rewrites its file through `edit` (which may drop a tensor by
// returning false, or change its dtype / shape / bytes).
struct EditableCheckpoint {
  MoeSpec spec = small_spec("qwen3-30b-a3b");
  int layer = test_layer(spec);
  std::string dir, file;
  std::string name(const std::string& rel) const {
    return "model.layers." + std::to_string(layer) + ".mlp." + rel;
  }

  explicit EditableCheckpoint(const std::string& d) : dir(d) {
    auto w = moekit::make_random_weights(spec, layer, 6);
    file = moekit::save_checkpoint(*w, dir, CheckpointNaming::Auto);
  }

  using Edit = std::function<bool(const std::string&, moekit::SafetensorsWriteTensor&,
                                  std::vector<uint8_t>& storage)>;
  void rewrite(const Edit& edit) {
    std::map<std::string, moekit::SafetensorsWriteTensor> t;
    std::deque<std::vector<uint8_t>> store;
    {
      SafetensorsFile f(file);
      for (const auto& n : f.names()) {
        const auto& info = f.info(n);
        const uint8_t* d = static_cast<const uint8_t*>(f.data(n));
        store.emplace_back(d, d + info.nbytes());
        moekit::SafetensorsWriteTensor x{info.dtype, info.shape, {}};
        if (!edit(n, x, store.back())) continue;
        x.bytes = std::span<const uint8_t>(store.back().data(), store.back().size());
        t[n] = x;
      }
    }
    moekit::write_safetensors(file, t);
  }
  void load() const { moekit::load_checkpoint_weights(spec, layer, dir); }
};

TEST(CheckpointErrors, MissingExpertTensor) {
  EditableCheckpoint c(scratch_dir());
  const std::string victim = c.name("experts.5.up_proj.weight");
  c.rewrite([&](const std::string& n, auto&, auto&) { return n != victim; });
  // The index still lists it: a stale index is reported as such.
  expect_error([&] { c.load(); },
               {"the index puts tensor '" + victim + "'", "which does not hold it"});
  fs::remove(c.dir + "/model.safetensors.index.json");
  expect_error([&] { c.load(); },
               {"has no tensor '" + victim + "'", "expert up_proj", "hf-mlp naming"});
}

TEST(CheckpointErrors, WrongExpertShape) {
  EditableCheckpoint c(scratch_dir());
  const std::string victim = c.name("experts.2.down_proj.weight");
  c.rewrite([&](const std::string& n, auto& t, auto& b) {
    if (n == victim) {
      t.shape = {64, 16};  // half the columns
      b.resize(64 * 16 * 2);
    }
    return true;
  });
  expect_error([&] { c.load(); },
               {victim, "expected shape [64, 32] (expert down_proj, H x I), got [64, 16]"});
}

TEST(CheckpointErrors, WrongRouterShape) {
  EditableCheckpoint c(scratch_dir());
  const std::string victim = c.name("gate.weight");
  c.rewrite([&](const std::string& n, auto& t, auto& b) {
    if (n == victim) {
      t.shape = {8, 64};
      b.resize(8 * 64 * 2);
    }
    return true;
  });
  expect_error([&] { c.load(); },
               {victim, "expected shape [16, 64] (router weight, E x H), got [8, 64]"});
}

TEST(CheckpointErrors, Fp8WithoutBlockScale) {
  EditableCheckpoint c(scratch_dir());
  const std::string victim = c.name("experts.0.gate_proj.weight");
  c.rewrite([&](const std::string& n, auto& t, auto& b) {
    if (n == victim) {
      t.dtype = DType::F8_E4M3;
      b.resize(b.size() / 2);
    }
    return true;
  });
  expect_error([&] { c.load(); },
               {victim, "is F8_E4M3 but has no block scale: tried '" + victim + "_scale_inv'"});
}

TEST(CheckpointErrors, Fp8BlockScaleOfWrongShape) {
  EditableCheckpoint c(scratch_dir());
  const std::string victim = c.name("experts.0.gate_proj.weight");
  std::vector<float> scale(4, 1.0f);
  c.rewrite([&](const std::string& n, auto& t, auto& b) {
    if (n == victim) {
      t.dtype = DType::F8_E4M3;
      b.resize(b.size() / 2);
    }
    return true;
  });
  // Add a [2, 2] scale where [1, 1] is expected (I = 32, H = 64: one block).
  {
    std::map<std::string, moekit::SafetensorsWriteTensor> extra;
    extra[victim + "_scale_inv"] = {DType::F32, {2, 2}, moekit::as_bytes_span(scale.data(), 4)};
    moekit::write_safetensors(c.dir + "/scale.safetensors", extra);
    fs::remove(c.dir + "/model.safetensors.index.json");  // found by scanning the directory
  }
  expect_error([&] { c.load(); },
               {victim + "_scale_inv", "expected shape [1, 1] (128x128 blocks), got [2, 2]"});
}

TEST(CheckpointErrors, UnsupportedDtype) {
  EditableCheckpoint c(scratch_dir());
  const std::string victim = c.name("experts.3.gate_proj.weight");
  // Rewrite the dtype of one tensor in the header to I16 (same size, so offsets stay valid).
  moekit::test::replace_tensor_dtype(c.file, victim, "\"BF16\"", "\"I16\" ");
  ASSERT_EQ(SafetensorsFile(c.file).info(victim).dtype_name, "I16");
  expect_error([&] { c.load(); }, {victim, "expected dtype BF16, F16, F32 or F8_E4M3, got I16"});
}

TEST(CheckpointErrors, NoRouterForTheLayer) {
  EditableCheckpoint c(scratch_dir());
  expect_error([&] { moekit::load_checkpoint_weights(c.spec, c.spec.moe_layers.at(0), c.dir); },
               {"has no router for layer 0 of qwen3-30b-a3b-small",
                "tried 'model.layers.0.mlp.gate.weight'", "tensors, e.g."});
}

TEST(CheckpointErrors, SharedExpertMissingFromNaming) {
  // A DeepSeek spec (shared expert) against a checkpoint that has none.
  const MoeSpec ds = small_spec("deepseek-v2-lite");
  const MoeSpec q = small_spec("qwen3-30b-a3b");
  auto w = moekit::make_random_weights(q, 3, 1);
  const std::string dir = scratch_dir();
  moekit::save_checkpoint(*w, dir, CheckpointNaming::Auto);
  expect_error(
      [&] { moekit::load_checkpoint_weights(ds, 3, dir); },
      {"has no tensor 'model.layers.3.mlp.shared_experts.gate_proj.weight'", "shared gate_proj"});
}

TEST(CheckpointErrors, DirectoryProblems) {
  const std::string dir = scratch_dir();
  const MoeSpec spec = small_spec("qwen3-30b-a3b");
  expect_error([&] { moekit::load_checkpoint_weights(spec, 3, dir + "/nope"); },
               {"does not exist"});
  expect_error([&] { moekit::load_checkpoint_weights(spec, 3, dir); },
               {"holds no *.safetensors files"});
  std::ofstream(dir + "/model.safetensors.index.json") << "{\"weight_map\": {\"a\": ";
  expect_error([&] { moekit::load_checkpoint_weights(spec, 3, dir); },
               {"model.safetensors.index.json is not valid JSON"});
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"weight_map": {"model.layers.3.mlp.gate.weight": "missing.safetensors"}})";
  expect_error([&] { moekit::load_checkpoint_weights(spec, 3, dir); },
               {"cannot open safetensors file", "missing.safetensors"});
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"weight_map": {"model.layers.3.mlp.gate.weight": "../../etc/passwd"}})";
  expect_error([&] { moekit::load_checkpoint_weights(spec, 3, dir); },
               {"must name a file inside the directory"});
  expect_error([&] { moekit::load_checkpoint_weights(small_spec("deepseek-v3"), 0, dir); },
               {"layer 0 of deepseek-v3-small is not an MoE layer"});
}

TEST(CheckpointErrors, IndexPointsAtTheWrongFile) {
  EditableCheckpoint c(scratch_dir());
  auto w = moekit::make_random_weights(c.spec, c.spec.moe_layers.at(5), 1);
  moekit::save_checkpoint(*w, c.dir, CheckpointNaming::Auto);
  // Point layer 3's router at layer 5's file.
  std::ifstream in(c.dir + "/model.safetensors.index.json");
  auto j = nlohmann::json::parse(in);
  j["weight_map"][c.name("gate.weight")] = "model-layer-5.safetensors";
  std::ofstream(c.dir + "/model.safetensors.index.json") << j.dump();
  expect_error([&] { c.load(); },
               {"the index puts tensor '" + c.name("gate.weight") + "'", "which does not hold it"});
}

TEST(CheckpointErrors, HashRoutedDeepSeekV4Layer) {
  const MoeSpec spec = small_spec("deepseek-v4-flash");
  ASSERT_GT(spec.num_hash_layers, 0);
  auto w = moekit::make_random_weights(spec, 0, 1);
  const std::string dir = scratch_dir();
  const std::string file = moekit::save_checkpoint(*w, dir, CheckpointNaming::Auto);
  // Make layer 0 look like the published hash layer: tid2eid instead of the score bias.
  moekit::test::rename_tensor(file, "layers.0.ffn.gate.bias", "layers.0.ffn.gate.tid2eid");
  fs::remove(dir + "/model.safetensors.index.json");
  expect_error([&] { moekit::load_checkpoint_weights(spec, 0, dir); },
               {"is hash-routed", "layers.0.ffn.gate.tid2eid", "num_hash_layers = 3"});
}

// Committed malformed files (tests/data/bad_checkpoints/, made by make_bad_checkpoints.py).
TEST(CheckpointErrors, CommittedFixtures) {
  const std::string d = std::string(MOEKIT_TEST_DATA_DIR) + "/data/bad_checkpoints/";
  const std::pair<const char*, const char*> cases[] = {
      {"truncated_length.safetensors", "is truncated"},
      {"header_past_end.safetensors", "exceeds the file size"},
      {"bad_json.safetensors", "invalid JSON header"},
      {"offsets_out_of_range.safetensors", "out of range"},
      {"span_mismatch.safetensors", "needs 24 bytes, data_offsets span 16"},
      {"shape_overflow.safetensors", "overflows 64 bits"},
      {"begin_after_end.safetensors", "begin 4 > end 2"},
  };
  for (const auto& [file, frag] : cases) {
    SCOPED_TRACE(file);
    expect_error([&] { SafetensorsFile f(d + file); }, {frag, file});
  }
  SafetensorsFile f(d + "unknown_dtype.safetensors");
  expect_error([&] { f.data("model.layers.0.mlp.gate.weight"); },
               {"has dtype Q4_WEIRD, which moekit does not read"});
}

}  // namespace

namespace {
// The fast fp8 encoder of the checkpoint writer agrees with the exhaustive reference
// (moekit::float_to_fp8_e4m3) on every value that matters: all codes, midpoints, out of range.
TEST(Fp8Encode, MatchesExhaustiveSearch) {
  std::vector<float> values = {0.0f, 1e-9f, -1e-9f, 448.0f,       449.0f,
                               1e6f, -1e6f, 464.0f, 0.0009765625f};
  for (int c = 0; c < 256; ++c) {
    const float v = moekit::fp8_e4m3_to_float(uint8_t(c));
    if (std::isnan(v)) continue;
    values.push_back(v);
    const float next = moekit::fp8_e4m3_to_float(uint8_t(c + 1));
    if (c != 127 && c != 255 && !std::isnan(next)) {
      values.push_back(0.5f * (v + next));  // tie: round to even code
      values.push_back(std::nextafter(0.5f * (v + next), v));
    }
  }
  for (float f : values) {
    const uint8_t q = moekit::io::fp8_e4m3_encode(f);
    const uint8_t want = moekit::float_to_fp8_e4m3(f);
    // The reference breaks the +0 / -0 tie towards the even code 0x80; both decode to zero.
    if (moekit::fp8_e4m3_to_float(want) == 0.0f) {
      EXPECT_EQ(moekit::fp8_e4m3_to_float(q), 0.0f) << "f = " << f;
      continue;
    }
    EXPECT_EQ(q, want) << "f = " << f;
  }
  EXPECT_EQ(moekit::io::fp8_e4m3_encode(-0.0f), 0x80);
  EXPECT_EQ(moekit::io::fp8_e4m3_encode(NAN), 0x7f);
}
}  // namespace

namespace {
// DeepSeek-V4 publishes routed experts as packed FP4 (I8 [N, K/2], low nibble = even column) with
// e8m0 scales <name>.scale [N, K/32]; they decode to fp4 * 2^(scale - 127).
TEST(Checkpoint, DeepSeekV4Fp4ExpertsDecode) {
  const MoeSpec spec = small_spec("deepseek-v4-flash");
  const int L = test_layer(spec);
  const size_t H = spec.hidden, I = spec.expert_intermediate;
  auto w = moekit::make_random_weights(spec, L, 12);
  const std::string dir = scratch_dir();
  const std::string file = moekit::save_checkpoint(*w, dir, CheckpointNaming::Auto);
  static const float kFp4[16] = {0,    0.5f,  1,  1.5f,  2,  3,  4,  6,
                                 -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  auto nib = [](size_t t, size_t r, size_t k) {
    return uint8_t((t * 5 + r * 3 + k * 11 + k / 7) % 16);
  };
  auto sc = [](size_t t, size_t r, size_t g) { return uint8_t(118 + (t + r + 5 * g) % 11); };
  auto value = [&](size_t t, size_t r, size_t k) {
    return kFp4[nib(t, r, k)] * std::ldexp(1.0f, int(sc(t, r, k / 32)) - 127);
  };
  const std::string base = "layers." + std::to_string(L) + ".ffn.experts.2.";
  const char* parts[3] = {"w1", "w3", "w2"};
  const size_t rows[3] = {I, I, H}, cols[3] = {H, H, I};
  std::map<std::string, moekit::SafetensorsWriteTensor> t;
  std::deque<std::vector<uint8_t>> store;
  {
    SafetensorsFile f(file);
    for (const auto& n : f.names()) {
      const uint8_t* d = static_cast<const uint8_t*>(f.data(n));
      store.emplace_back(d, d + f.info(n).nbytes());
      t[n] = {f.dtype(n), f.shape(n), {store.back().data(), store.back().size()}};
    }
  }
  for (size_t p = 0; p < 3; ++p) {
    std::vector<uint8_t>& q = store.emplace_back(rows[p] * cols[p] / 2);
    std::vector<uint8_t>& s = store.emplace_back(rows[p] * cols[p] / 32);
    for (size_t r = 0; r < rows[p]; ++r) {
      for (size_t k = 0; k < cols[p]; k += 2)
        q[(r * cols[p] + k) / 2] = uint8_t(nib(p, r, k) | nib(p, r, k + 1) << 4);
      for (size_t g = 0; g < cols[p] / 32; ++g) s[r * (cols[p] / 32) + g] = sc(p, r, g);
    }
    // Written as F8_E4M3 (one byte each), then the header says I8 / F8_E8M0.
    t[base + parts[p] + ".weight"] = {
        DType::F8_E4M3, {int64_t(rows[p]), int64_t(cols[p] / 2)}, {q.data(), q.size()}};
    t[base + parts[p] + ".scale"] = {
        DType::F8_E4M3, {int64_t(rows[p]), int64_t(cols[p] / 32)}, {s.data(), s.size()}};
  }
  moekit::write_safetensors(file, t);
  for (const char* part : parts) {
    moekit::test::replace_tensor_dtype(file, base + part + ".weight", "\"F8_E4M3\"", "\"I8\"     ");
    moekit::test::replace_tensor_dtype(file, base + part + ".scale", "\"F8_E4M3\"", "\"F8_E8M0\"");
  }
  fs::remove(dir + "/model.safetensors.index.json");  // the index lacks the new .scale tensors
  auto l = moekit::load_checkpoint_weights(spec, L, dir);
  const auto v = l->expert(2);
  for (size_t r = 0; r < I; ++r) {
    for (size_t c = 0; c < H; ++c) {
      ASSERT_EQ(moekit::bf16_to_float(v.w13[r * H + c]), value(0, r, c)) << r << "," << c;
      ASSERT_EQ(moekit::bf16_to_float(v.w13[(I + r) * H + c]), value(1, r, c)) << r << "," << c;
    }
  }
  for (size_t r = 0; r < H; ++r)
    for (size_t c = 0; c < I; ++c)
      ASSERT_EQ(moekit::bf16_to_float(v.w2[r * I + c]), value(2, r, c));
  // The other experts are untouched bf16.
  EXPECT_EQ(std::memcmp(l->expert(1).w13, w->expert(1).w13, 2 * I * H * 2), 0);
}
}  // namespace

namespace {
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
