// Malformed checkpoints are refused naming the tensor, what was expected and what was found:
// missing tensors, wrong shapes and dtypes, fp8 without its block scale, directories and indexes
// that point nowhere, hash-routed layers, and the committed malformed fixtures.
#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "expect_error.h"
#include "io_test_util.h"
#include "moekit/checkpoint.h"
#include "moekit/error.h"
#include "moekit/safetensors.h"
#include "moekit/weights.h"

using moekit::CheckpointNaming;
using moekit::DType;
using moekit::MoeSpec;
using moekit::SafetensorsFile;
using moekit::test::scratch_dir;
using moekit::test::small_spec;
using moekit::test::test_layer;
namespace fs = std::filesystem;

namespace {

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
