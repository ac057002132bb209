// The catalogue of bad inputs (issue 6): malformed configs, checkpoints, CLI arguments and API
// arguments, each answered by a moekit::Error (or a non-zero exit) whose text names the problem;
// plus one regression test per numerical trail that serving engines have shipped:
//   - group masks filled with 0 instead of -inf (keys can be negative),
//   - weights recovered as key - bias (all zero for biases ~12 and scores ~1e-8),
//   - fused shared-expert ids outside the range the dispatch counts (E + S weight rows),
//   - duplicate expert ids in one token (ties).
// Each catalogue entry is one ctest case (value-parameterised), named after what is wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "expect_error.h"
#include "io_test_util.h"
#include "moekit/checkpoint.h"
#include "moekit/cpu_fast.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/routing.h"
#include "moekit/safetensors.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_error;
using test::scratch_dir;
using test::small_spec;

json read_config(const std::string& model) {
  std::ifstream in(std::string(MOEKIT_TEST_DATA_DIR) + "/../configs/" + model + ".json");
  EXPECT_TRUE(in) << model;
  return json::parse(in);
}

// ------------------------------------------------------------------------------------------------
// Configs: a real config.json with one thing broken.

struct ConfigCase {
  const char* name;
  const char* model;                   // configs/<model>.json as the starting point
  std::function<void(json&)> mutate;   // the breakage (on text_config for nested configs)
  std::vector<std::string> fragments;  // the error must name these
  const char* raw = nullptr;           // instead of model + mutate: this text
};

void PrintTo(const ConfigCase& c, std::ostream* os) { *os << c.name; }

class BadConfig : public ::testing::TestWithParam<ConfigCase> {};

TEST_P(BadConfig, RefusedNamingKeyAndValue) {
  const ConfigCase& c = GetParam();
  std::string text;
  if (c.raw) {
    text = c.raw;
  } else {
    json top = read_config(c.model);
    c.mutate(top.contains("text_config") ? top["text_config"] : top);
    text = top.dump();
  }
  expect_error([&] { parse_spec_json(text, "bad"); }, c.fragments);
}

const ConfigCase kConfigCases[] = {
    {"NotJson", "", nullptr, {"config 'bad' is not valid JSON"}, "{\"hidden_size\": 7168,"},
    // Found by fuzz/fuzz_spec: nlohmann throws out_of_range (not parse_error) for a number
    // beyond double, which escaped parse_spec_json as a foreign exception.
    {"NumberBeyondDouble",
     "",
     nullptr,
     {"config 'bad' is not valid JSON", "number overflow"},
     R"({"model_type": "deepseek_v3", "hidden_size": 9e956})"},
    {"NotAnObject", "", nullptr, {"config 'bad' must be a JSON object, got array"}, "[1, 2]"},
    {"MissingModelType",
     "mixtral-8x7b",
     [](json& c) {
       c.erase("model_type");
       c.erase("architectures");
     },
     {"missing key 'model_type'"}},
    {"MissingHiddenSize",
     "deepseek-v3",
     [](json& c) { c["hidden_size"] = nullptr; },  // absent would take the class default
     {"missing key 'hidden_size'"}},
    {"ZeroHiddenSize",
     "deepseek-v3",
     [](json& c) { c["hidden_size"] = 0; },
     {"'hidden_size' must be a positive size, got 0"}},
    {"NegativeIntermediate",
     "deepseek-v3",
     [](json& c) { c["moe_intermediate_size"] = -2048; },
     {"'moe_intermediate_size' must be a positive size, got -2048"}},
    {"HiddenSizeAsString",
     "deepseek-v3",
     [](json& c) { c["hidden_size"] = "7168"; },
     {"key 'hidden_size' must be an integer, got \"7168\""}},
    {"HiddenSizeAsFloat",
     "qwen3-30b-a3b",
     [](json& c) { c["hidden_size"] = 2048.5; },
     {"key 'hidden_size' must be an integer, got 2048.5"}},
    {"MissingExpertCount",
     "deepseek-v3",
     [](json& c) { c["n_routed_experts"] = nullptr; },
     {"missing key 'n_routed_experts' or 'num_experts' or 'num_local_experts'"}},
    {"TopKAboveExperts",
     "deepseek-v3",
     [](json& c) { c["num_experts_per_tok"] = 300; },
     {"num_experts_per_tok = 300", "number of experts = 256"}},
    {"ExpertsNotDivisibleByGroups",
     "deepseek-v3",
     [](json& c) { c["n_group"] = 7; },
     {"number of experts = 256 is not divisible by n_group = 7"}},
    {"TopkGroupAboveGroups",
     "deepseek-v3",
     [](json& c) { c["topk_group"] = 9; },
     {"topk_group = 9 must be in [1, n_group = 8]"}},
    {"TopKBeyondKeptGroups",
     "deepseek-v3",
     [](json& c) {
       c["topk_group"] = 1;
       c["num_experts_per_tok"] = 33;
     },
     {"num_experts_per_tok = 33 exceeds the 32 experts of the topk_group = 1 groups kept"}},
    {"UnknownScoringFunction",
     "deepseek-v3",
     [](json& c) { c["scoring_func"] = "relu"; },
     {"unknown 'scoring_func' = 'relu'"}},
    {"UnknownActivation",
     "qwen3-30b-a3b",
     [](json& c) { c["hidden_act"] = "gelu"; },
     {"unsupported 'hidden_act' = 'gelu'"}},
    {"UnknownRouterDtype",
     "minimax-m2",
     [](json& c) { c["router_dtype"] = "int8"; },
     {"unknown 'router_dtype' = 'int8'"}},
    {"NegativeRoutedScaling",
     "deepseek-v3",
     [](json& c) { c["routed_scaling_factor"] = -2.5; },
     {"routed_scaling_factor must be a positive number, got -2.5"}},
    {"RoutedScalingAsString",
     "deepseek-v3",
     [](json& c) { c["routed_scaling_factor"] = "2.5"; },
     {"key 'routed_scaling_factor' must be a number, got \"2.5\""}},
    {"NormTopkProbNotBool",
     "qwen3-30b-a3b",
     [](json& c) { c["norm_topk_prob"] = "yes"; },
     {"key 'norm_topk_prob' must be true or false, got \"yes\""}},
    {"NegativeSwigluLimit",
     "deepseek-v3",
     [](json& c) { c["swiglu_limit"] = -7.0; },
     {"swiglu_limit must be >= 0, got -7"}},
    {"DenseReplaceBeyondLayers",
     "deepseek-v3",
     [](json& c) { c["first_k_dense_replace"] = 100; },
     {"'first_k_dense_replace' = 100 outside [0, num_hidden_layers = 61]"}},
    {"AllLayersDense",
     "deepseek-v3",
     [](json& c) { c["first_k_dense_replace"] = 61; },
     {"no layer of the 61 is an MoE layer"}},
    {"HugeLayerCount",
     "mixtral-8x7b",
     [](json& c) { c["num_hidden_layers"] = 1 << 30; },
     {"'num_hidden_layers' = 1073741824 exceeds 65536"}},
    {"SharedWidthOverflowsInt",
     "deepseek-v3",
     [](json& c) { c["n_shared_experts"] = 1 << 30; },
     {"'n_shared_experts * moe_intermediate_size' must be a positive size, got 2199023255552"}},
    {"NegativeSharedExperts",
     "mixtral-8x7b",
     [](json& c) { c["n_shared_experts"] = -1; },
     {"shared expert sizes must not be negative"}},
    {"HashLayersBeyondLayers",
     "deepseek-v4-flash",
     [](json& c) { c["num_hash_layers"] = 100; },
     {"num_hash_layers = 100 outside [0, 43]"}},
    {"MoeLayerFreqWrongLength",
     "minimax-m3",
     [](json& c) {
       c["moe_layer_freq"] = {0, 1, 1};
     },
     {"'moe_layer_freq' has 3 entries, expected num_hidden_layers = 60"}},
    {"MlpOnlyLayersNotAList",
     "qwen3-30b-a3b",
     [](json& c) { c["mlp_only_layers"] = 3; },
     {"'mlp_only_layers' must be a list"}},
    {"ZeroSparseStep",
     "qwen3-30b-a3b",
     [](json& c) { c["decoder_sparse_step"] = 0; },
     {"'decoder_sparse_step' must be >= 1, got 0"}},
};

INSTANTIATE_TEST_SUITE_P(Catalogue, BadConfig, ::testing::ValuesIn(kConfigCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(BadConfigFile, UnknownShortNameListsKnownModels) {
  expect_error([] { load_spec("no-such-model"); },
               {"unknown model 'no-such-model'", "known models:", "deepseek-v3"});
}

TEST(BadConfigFile, MissingPath) {
  expect_error([] { load_spec("/nonexistent/dir/config.json"); },
               {"config file '/nonexistent/dir/config.json' does not exist"});
}

TEST(BadConfigFile, DirectoryWithoutConfigJson) {
  const std::string dir = scratch_dir();
  expect_error([&] { load_spec(dir); }, {"directory '" + dir + "' holds no config.json"});
}

TEST(BadConfigFile, FusionAskedWithoutSharedExpert) {
  const MoeSpec s = load_spec("mixtral-8x7b");
  expect_error([&] { validate_spec(s, /*require_fusable=*/true); },
               {"shared-expert fusion asked for, but the model has no shared expert"});
}

TEST(BadConfigFile, FusionAskedWithPartialSharedWidth) {
  json c = read_config("qwen2-57b-a14b");
  c["shared_expert_intermediate_size"] = 3000;  // not a multiple of 2560
  const MoeSpec s = parse_spec_json(c.dump(), "qwen2-odd");
  EXPECT_EQ(s.shared_slots(), 0);
  expect_error([&] { validate_spec(s, true); },
               {"shared width = 3000", "expert intermediate size = 2560"});
}

// ------------------------------------------------------------------------------------------------
// safetensors files, byte by byte.

// [8-byte little-endian header length][header][data]; header_len < 0 means the header's size.
std::string write_raw(const std::string& path, const std::string& header, size_t data_bytes,
                      int64_t header_len = -1) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = header_len >= 0 ? static_cast<uint64_t>(header_len) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\x3c');
  return path;
}

struct FileCase {
  const char* name;
  std::string header;
  size_t data_bytes;
  int64_t header_len;
  std::vector<std::string> fragments;
};

void PrintTo(const FileCase& c, std::ostream* os) { *os << c.name; }

class BadSafetensors : public ::testing::TestWithParam<FileCase> {};

TEST_P(BadSafetensors, RefusedAtOpenNamingFile) {
  const FileCase& c = GetParam();
  const std::string path =
      write_raw(scratch_dir() + "/t.safetensors", c.header, c.data_bytes, c.header_len);
  std::vector<std::string> fragments = c.fragments;
  fragments.push_back(path);
  expect_error([&] { SafetensorsFile f(path); }, fragments);
}

const FileCase kFileCases[] = {
    {"HeaderLengthBeyondFile", R"({})", 0, 4096, {"header length 4096 exceeds the file size 10"}},
    {"InvalidJsonHeader", R"({"w": {"dtype": "BF16",)", 16, -1, {"invalid JSON header"}},
    {"HeaderNotAnObject",
     R"([1,2,3])",
     0,
     -1,
     {"expected the header to be a JSON object, got array"}},
    {"OffsetsBeyondData",
     R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
     8,
     -1,
     {"tensor 'w'", "data_offsets [0, 16] out of range: the data section holds 8 bytes"}},
    {"OffsetsReversed",
     R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})",
     8,
     -1,
     {"tensor 'w'", "data_offsets begin 8 > end 4"}},
    {"ShapeTimesDtypeMismatch",
     R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,6]}})",
     8,
     -1,
     {"tensor 'w'", "shape [2, 2] of BF16 needs 8 bytes, data_offsets span 6"}},
    {"ShapeOverflows64Bits",
     R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
     8,
     -1,
     {"tensor 'w'", "overflows 64 bits"}},
    {"NegativeDimension",
     R"({"w":{"dtype":"F32","shape":[-1,2],"data_offsets":[0,8]}})",
     8,
     -1,
     {"tensor 'w'", "expected non-negative integer dimensions"}},
    {"ShapeNotAnArray",
     R"({"w":{"dtype":"F32","shape":"4","data_offsets":[0,16]}})",
     16,
     -1,
     {"tensor 'w'", "expected an array 'shape'"}},
    {"DtypeMissing",
     R"({"w":{"shape":[4],"data_offsets":[0,16]}})",
     16,
     -1,
     {"tensor 'w'", "expected a string 'dtype', got none"}},
    {"OffsetsNotPair",
     R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0]}})",
     16,
     -1,
     {"tensor 'w'", "expected 'data_offsets' [begin, end]"}},
    {"MetadataValueNotString",
     R"({"__metadata__":{"format":3}})",
     0,
     -1,
     {"__metadata__ key 'format' must map to a string, got 3"}},
};

INSTANTIATE_TEST_SUITE_P(Catalogue, BadSafetensors, ::testing::ValuesIn(kFileCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(BadSafetensorsFile, TruncatedBeforeHeaderLength) {
  const std::string path = scratch_dir() + "/t.safetensors";
  std::ofstream(path, std::ios::binary) << "abcd";
  expect_error([&] { SafetensorsFile f(path); },
               {path, "is truncated: 4 bytes", "8-byte header length"});
}

TEST(BadSafetensorsFile, UnknownDtypeListedButRefusedOnAccess) {
  const std::string path =
      write_raw(scratch_dir() + "/t.safetensors",
                R"({"q":{"dtype":"Q4_K","shape":[4],"data_offsets":[0,2]}})", 2);
  SafetensorsFile f(path);
  EXPECT_EQ(f.info("q").dtype_name, "Q4_K");
  expect_error([&] { f.data("q"); }, {"tensor 'q'", "has dtype Q4_K, which moekit does not read"});
}

// ------------------------------------------------------------------------------------------------
// Checkpoints: one MoE layer of a small DeepSeek-V3 saved under its published names, then broken.

struct RawTensor {
  std::string dtype;  // safetensors spelling, any string
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
using TensorTable = std::map<std::string, RawTensor>;

TensorTable read_table(const std::string& path) {
  SafetensorsFile f(path);
  TensorTable out;
  for (const std::string& n : f.names()) {
    const SafetensorsTensorInfo& t = f.info(n);
    const uint8_t* p = static_cast<const uint8_t*>(f.raw_data(n));
    out[n] = {t.dtype_name, t.shape, std::vector<uint8_t>(p, p + t.nbytes())};
  }
  return out;
}

// A plain safetensors writer that takes any dtype name (write_safetensors takes only moekit's).
void write_table(const std::string& path, const TensorTable& table) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : table) {
    header[name] = {{"dtype", t.dtype},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << text;
  for (const auto& [name, t] : table)
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
}

class BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = small_spec("deepseek-v3");  // H 64, E 16, I 32, one shared expert, correction bias
    layer_ = spec_.moe_layers.front();
    const auto w = make_random_weights(spec_, layer_, 5);
    root_ = scratch_dir();
    table_ = read_table(save_checkpoint(*w, root_ + "/good"));
    prefix_ = "model.layers." + std::to_string(layer_) + ".mlp.";
  }
  // Writes `table` as the only file of a fresh directory and loads it.
  void load(const TensorTable& table) {
    const std::string dir = root_ + "/broken";
    fs::remove_all(dir);
    fs::create_directories(dir);
    write_table(dir + "/model.safetensors", table);
    load_checkpoint_weights(spec_, layer_, dir);
  }
  std::string name(const std::string& rel) const { return prefix_ + rel; }

  MoeSpec spec_;
  int layer_ = 0;
  std::string root_, prefix_;
  TensorTable table_;
};

TEST_F(BadCheckpoint, TheUnbrokenOneLoads) {
  EXPECT_NO_THROW(load(table_));  // so every refusal below is about its one breakage
}

TEST_F(BadCheckpoint, MissingExpertTensor) {
  TensorTable t = table_;
  ASSERT_EQ(t.erase(name("experts.2.down_proj.weight")), 1u);
  expect_error([&] { load(t); },
               {"has no tensor '" + name("experts.2.down_proj.weight") + "'", "expert down_proj"});
}

TEST_F(BadCheckpoint, RouterWrongShape) {
  TensorTable t = table_;
  RawTensor& r = t.at(name("gate.weight"));
  r.shape = {15, 64};
  r.bytes.resize(15 * 64 * 2);
  expect_error([&] { load(t); }, {name("gate.weight"),
                                  "expected shape [16, 64] (router weight, E x H), got [15, 64]"});
}

TEST_F(BadCheckpoint, RouterWrongDtype) {
  TensorTable t = table_;
  RawTensor& r = t.at(name("gate.weight"));
  r.dtype = "F8_E4M3";
  r.bytes.resize(16 * 64);
  expect_error([&] { load(t); },
               {name("gate.weight"), "expected dtype BF16, F16 or F32, got F8_E4M3"});
}

TEST_F(BadCheckpoint, ExpertWrongShape) {
  TensorTable t = table_;
  RawTensor& r = t.at(name("experts.0.gate_proj.weight"));
  r.shape = {32, 65};
  r.bytes.resize(32 * 65 * 2);
  expect_error([&] { load(t); },
               {name("experts.0.gate_proj.weight"),
                "expected shape [32, 64] (expert gate_proj, I x H), got [32, 65]"});
}

TEST_F(BadCheckpoint, ExpertIntegerDtype) {
  TensorTable t = table_;
  RawTensor& r = t.at(name("experts.1.up_proj.weight"));
  r.dtype = "I16";  // same byte count as BF16, so only the dtype is wrong
  expect_error([&] { load(t); }, {name("experts.1.up_proj.weight"),
                                  "expected dtype BF16, F16, F32 or F8_E4M3, got I16"});
}

TEST_F(BadCheckpoint, Fp8ExpertWithoutBlockScale) {
  TensorTable t = table_;
  RawTensor& r = t.at(name("experts.3.gate_proj.weight"));
  r.dtype = "F8_E4M3";
  r.bytes.resize(32 * 64);
  expect_error([&] { load(t); }, {name("experts.3.gate_proj.weight"),
                                  "is F8_E4M3 but has no block scale", "_scale_inv"});
}

TEST_F(BadCheckpoint, MissingCorrectionBias) {
  TensorTable t = table_;
  ASSERT_EQ(t.erase(name("gate.e_score_correction_bias")), 1u);
  expect_error([&] { load(t); }, {"has no tensor '" + name("gate.e_score_correction_bias") + "'"});
}

TEST_F(BadCheckpoint, SharedExpertWrongShape) {
  TensorTable t = table_;
  RawTensor& r = t.at(name("shared_experts.down_proj.weight"));
  r.shape = {32, 64};  // transposed: expected [H, Is] = [64, 32]
  expect_error([&] { load(t); },
               {name("shared_experts.down_proj.weight"),
                "expected shape [64, 32] (shared down_proj, H x Is), got [32, 64]"});
}

TEST_F(BadCheckpoint, OtherLayerOnly) {
  TensorTable t;
  for (const auto& [n, v] : table_) {
    std::string renamed = n;
    renamed.replace(0, prefix_.size(), "model.layers.99.mlp.");
    t[renamed] = v;
  }
  expect_error([&] { load(t); },
               {"has no router for layer " + std::to_string(layer_), "model.layers.99.mlp."});
}

TEST_F(BadCheckpoint, TruncatedFile) {
  const std::string dir = root_ + "/truncated";
  fs::create_directories(dir);
  write_table(dir + "/model.safetensors", table_);
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") - 100);
  expect_error([&] { load_checkpoint_weights(spec_, layer_, dir); },
               {"out of range", "file truncated?"});
}

TEST_F(BadCheckpoint, DenseLayer) {
  expect_error([&] { load_checkpoint_weights(spec_, 0, root_ + "/good"); },
               {"layer 0 of deepseek-v3-small is not an MoE layer"});
}

TEST_F(BadCheckpoint, MissingDirectory) {
  expect_error([&] { load_checkpoint_weights(spec_, layer_, root_ + "/nowhere"); },
               {"checkpoint path " + root_ + "/nowhere does not exist"});
}

TEST_F(BadCheckpoint, EmptyDirectory) {
  fs::create_directories(root_ + "/empty");
  expect_error([&] { load_checkpoint_weights(spec_, layer_, root_ + "/empty"); },
               {"holds no *.safetensors files"});
}

TEST_F(BadCheckpoint, IndexNotJson) {
  std::ofstream(root_ + "/good/model.safetensors.index.json") << "{\"weight_map\": ";
  expect_error([&] { load_checkpoint_weights(spec_, layer_, root_ + "/good"); },
               {"model.safetensors.index.json is not valid JSON"});
}

TEST_F(BadCheckpoint, IndexEscapesDirectory) {
  json index = {{"weight_map", {{name("gate.weight"), "../elsewhere.safetensors"}}}};
  std::ofstream(root_ + "/good/model.safetensors.index.json") << index.dump();
  expect_error([&] { load_checkpoint_weights(spec_, layer_, root_ + "/good"); },
               {"'../elsewhere.safetensors' must name a file inside the directory"});
}

TEST_F(BadCheckpoint, IndexPointsToFileWithoutTheTensor) {
  const std::string dir = root_ + "/indexed";
  fs::create_directories(dir);
  write_table(dir + "/a.safetensors", table_);
  TensorTable other = {{"unrelated", {"F32", {1}, {0, 0, 0, 0}}}};
  write_table(dir + "/b.safetensors", other);
  json map = json::object();
  for (const auto& [n, v] : table_) map[n] = "a.safetensors";
  map[name("gate.weight")] = "b.safetensors";
  std::ofstream(dir + "/model.safetensors.index.json") << json{{"weight_map", map}}.dump();
  expect_error(
      [&] { load_checkpoint_weights(spec_, layer_, dir); },
      {"the index puts tensor '" + name("gate.weight") + "' in", "which does not hold it"});
}

// ------------------------------------------------------------------------------------------------
// CLI arguments: the built `moekit` binary, its exit status and its stderr.

struct CliResult {
  int status = -1;
  std::string err;
};

CliResult run_cli(const std::string& dir, const std::string& args) {
  const std::string err = dir + "/stderr.txt";
  const std::string cmd = std::string(MOEKIT_CLI_PATH) + " " + args + " >/dev/null 2>" + err;
  const int rc = std::system(cmd.c_str());
  CliResult r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  std::ifstream in(err);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  return r;
}

// A small DeepSeek-V3 config (H 64, E 16) on disk, so runs that get past argument checks are fast.
std::string tiny_config(const std::string& dir) {
  json c = read_config("deepseek-v3");
  c["hidden_size"] = 64;
  c["n_routed_experts"] = 16;
  c["moe_intermediate_size"] = 32;
  const std::string path = dir + "/tiny-deepseek.json";
  std::ofstream(path) << c.dump();
  return path;
}

struct CliCase {
  const char* name;
  std::string args;  // "{tiny}" is replaced by the small config's path
  std::vector<std::string> fragments;
};

void PrintTo(const CliCase& c, std::ostream* os) { *os << c.name; }

class BadCli : public ::testing::TestWithParam<CliCase> {};

TEST_P(BadCli, ExitsNonZeroNamingTheArgument) {
  if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built";
  const CliCase& c = GetParam();
  const std::string dir = scratch_dir();
  std::string args = c.args;
  if (auto p = args.find("{tiny}"); p != std::string::npos) args.replace(p, 6, tiny_config(dir));
  const CliResult r = run_cli(dir, args);
  EXPECT_NE(r.status, 0) << "moekit " << args;
  EXPECT_LT(r.status, 128) << "moekit " << args << " died of a signal:\n" << r.err;
  for (const std::string& f : c.fragments)
    EXPECT_NE(r.err.find(f), std::string::npos)
        << "'" << f << "' not in stderr of moekit " << args << ":\n"
        << r.err;
}

const CliCase kCliCases[] = {
    {"UnknownModel", "run --model no-such-model", {"unknown model 'no-such-model'"}},
    {"ModelMissing", "run --tokens 2", {"--model", "required"}},
    {"ZeroTokens", "run --model {tiny} --tokens 0", {"--tokens must be >= 1, got 0"}},
    {"NegativeTokens", "run --model {tiny} --tokens -3", {"--tokens must be >= 1, got -3"}},
    {"TokensNotANumber", "run --model {tiny} --tokens lots", {"--tokens", "lots"}},
    {"FuseSharedBadValue",
     "run --model {tiny} --fuse-shared maybe",
     {"unknown fuse_shared mode 'maybe' (expected auto, on or off)"}},
    {"FuseOnWithoutSharedExpert",
     "run --model mixtral-8x7b --fuse-shared on",
     {"--fuse-shared on: 'mixtral-8x7b' has no shared expert"}},
    {"DenseLayer",
     "run --model {tiny} --layer 0",
     {"--layer 0 is a dense layer of", "first MoE layer is 3"}},
    {"LayerOutOfRange",
     "run --model {tiny} --layer 500",
     {"--layer 500 is out of range", "61 layers"}},
    {"BogusDevice",
     "run --model {tiny} --device bogus",
     {"--device 'bogus' is not one of auto, cpu, cuda"}},
    {"BogusBackend",
     "run --model {tiny} --device cpu --backend bogus",
     {"--backend 'bogus' is not one of fast, reference"}},
    {"WeightsDirMissing",
     "run --model {tiny} --device cpu --weights /nonexistent/ckpt",
     {"checkpoint path /nonexistent/ckpt does not exist"}},
    {"BatchEmptyEntry",
     "bench --model {tiny} --device cpu --batch 1,,2",
     {"--batch '1,,2' has an empty entry"}},
    {"BatchZero",
     "bench --model {tiny} --device cpu --batch 0",
     {"--batch '0': '0' must be a whole number in [1, 1048576]"}},
    {"BatchNotANumber",
     "bench --model {tiny} --device cpu --batch 4,x",
     {"--batch '4,x': 'x' is not a number"}},
    {"InspectBrokenConfig",
     "inspect --model /nonexistent/config.json",
     {"config file '/nonexistent/config.json' does not exist"}},
};

INSTANTIATE_TEST_SUITE_P(Catalogue, BadCli, ::testing::ValuesIn(kCliCases),
                         [](const auto& info) { return std::string(info.param.name); });

// ------------------------------------------------------------------------------------------------
// API arguments.

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
  json c = read_config("qwen2-57b-a14b");
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
  json c = read_config("mixtral-8x7b");
  c["hidden_size"] = 1 << 20;
  c["num_local_experts"] = 4096;
  c["intermediate_size"] = 1 << 16;
  const MoeSpec s = parse_spec_json(c.dump(), "huge");
  EXPECT_GT(host_bytes_needed(s, 1 << 20, false), size_t{4096} * s.expert_bytes() - 1);
  expect_error([&] { check_host_memory(s, 1 << 20, false); }, {"GB of host memory for huge"});
  expect_error([&] { host_bytes_needed(s, -1, false); }, {"expected tokens >= 0, got -1"});
}

// ------------------------------------------------------------------------------------------------
// Regressions for the numerical trails. LayerWeights with a hand-set router and correction bias
// (the experts and shared MLP stay the random ones) drive the whole layer, so the trails are
// checked where they happened in serving engines: in the layer, not only in the routing function.

class HandSetRouter final : public LayerWeights {
 public:
  explicit HandSetRouter(std::unique_ptr<LayerWeights> base)
      : LayerWeights(base->spec(), base->layer()), base_(std::move(base)) {
    const MoeSpec& s = spec_;
    MK_CHECK(s.router_dtype == DType::BF16, "test expects a bf16 router");
    router_weight_.assign(static_cast<size_t>(s.router_columns()) * s.hidden * 2, 0);
    correction_bias_.assign(s.num_experts, 0.0f);
    if (base_->shared_w13()) {
      const size_t is = s.shared_intermediate, h = s.hidden;
      shared_w13_.assign(base_->shared_w13(), base_->shared_w13() + 2 * is * h);
      shared_w2_.assign(base_->shared_w2(), base_->shared_w2() + h * is);
    }
  }
  // Router row e := value / H in every column, so x = all ones gives logit e = value exactly
  // (value / H must be exact in bf16: 8 significant bits).
  void set_logit(int e, float value) {
    Bf16* wg =
        reinterpret_cast<Bf16*>(router_weight_.data()) + static_cast<size_t>(e) * spec_.hidden;
    const Bf16 v = float_to_bf16(value / static_cast<float>(spec_.hidden));
    EXPECT_EQ(bf16_to_float(v) * spec_.hidden, value) << "logit " << value << " not exact";
    for (int h = 0; h < spec_.hidden; ++h) wg[h] = v;
  }
  void set_bias(int e, float b) { correction_bias_[e] = b; }

  ExpertView expert(int e) const override { return base_->expert(e); }
  int materialised_experts() const override { return base_->materialised_experts(); }
  std::string origin() const override { return "hand-set router over " + base_->origin(); }

 private:
  std::unique_ptr<LayerWeights> base_;
};

std::vector<Bf16> ones(const MoeSpec& s, int tokens) {
  return std::vector<Bf16>(static_cast<size_t>(tokens) * s.hidden, float_to_bf16(1.0f));
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(NumericalTrail, MaskedGroupKeysAreMinusInfinityNotZero) {
  // small DeepSeek-V3: E 16 in 8 groups of 2, 4 groups kept, top-8 = every expert of the kept
  // groups. Every bias is -4, so every key is negative; a group mask of 0 would make the masked
  // experts the *best* keys and they would be picked instead.
  const MoeSpec s = small_spec("deepseek-v3");
  ASSERT_EQ(s.n_group, 8);
  ASSERT_EQ(s.topk_group, 4);
  HandSetRouter w(make_random_weights(s, s.moe_layers.front(), 11));
  // Group g's logits: 0.5 * ((g * 5) % 8) - 2 and one below it: kept groups have the highest g*5%8.
  std::set<int> kept_groups;
  for (int g = 0; g < 8; ++g) {
    const float top = 0.5f * static_cast<float>((g * 5) % 8) - 2.0f;
    w.set_logit(2 * g, top);
    w.set_logit(2 * g + 1, top - 0.25f);
    if ((g * 5) % 8 >= 4) kept_groups.insert(g);
  }
  for (int e = 0; e < 16; ++e) w.set_bias(e, -4.0f);
  ASSERT_EQ(kept_groups.size(), 4u);
  const std::vector<Bf16> x = ones(s, 3);
  for (bool fast : {false, true}) {
    const ForwardResult r = fast ? cpu_fast::forward(w, x.data(), 3, FuseShared::Off)
                                 : cpu_reference::forward(w, x.data(), 3, FuseShared::Off);
    for (int t = 0; t < 3; ++t) {
      for (int j = 0; j < s.top_k; ++j) {
        const int id = r.routing.ids[t * r.routing.slots + j];
        EXPECT_TRUE(kept_groups.count(id / 2))
            << "expert " << id << " of masked group " << id / 2 << " picked (fast " << fast << ")";
      }
    }
  }
}

TEST(NumericalTrail, WeightsFromScoreNotKeyMinusBias) {
  // Biases ~12 and logits ~ -18 (sigmoid ~ 1.5e-8): in fp32, key - bias == 0 exactly, so weights
  // recovered that way are all zero (and renormalising 0/0 gives 0 or NaN). The weights must be
  // the renormalised sigmoid scores x routed_scaling_factor, and the output non-zero.
  const MoeSpec s = small_spec("deepseek-v3");
  HandSetRouter w(make_random_weights(s, s.moe_layers.front(), 12));
  for (int e = 0; e < 16; ++e) {
    w.set_logit(e, -18.0f - 0.125f * static_cast<float>(e));
    w.set_bias(e, 12.0f + 0.01f * static_cast<float>(e));  // selection by bias: 15, 14, ..., 8
  }
  const float key15 = static_cast<float>(sigmoid(-18.0 - 0.125 * 15)) + (12.0f + 0.15f);
  ASSERT_EQ(key15 - (12.0f + 0.15f), 0.0f) << "the case must be the one where key - bias fails";
  const std::vector<Bf16> x = ones(s, 2);
  double denom = 0.0;
  for (int e = 8; e < 16; ++e) denom += sigmoid(-18.0 - 0.125 * e);
  for (bool fast : {false, true}) {
    const ForwardResult r = fast ? cpu_fast::forward(w, x.data(), 2, FuseShared::Off)
                                 : cpu_reference::forward(w, x.data(), 2, FuseShared::Off);
    for (int t = 0; t < 2; ++t) {
      for (int j = 0; j < 8; ++j) {
        const int id = r.routing.ids[t * r.routing.slots + j];
        EXPECT_EQ(id, 15 - j);
        const double want = sigmoid(-18.0 - 0.125 * id) / denom * s.routed_scaling_factor;
        EXPECT_NEAR(r.routing.weights[t * r.routing.slots + j], want, 1e-5 * want);
      }
    }
    // The routed part is non-zero: compare with the unfused shared MLP alone.
    std::vector<float> shared(s.hidden);
    cpu_reference::shared_forward(w, x.data(), shared.data());
    double diff = 0.0;
    for (int h = 0; h < s.hidden; ++h) diff += std::fabs(r.y[h] - shared[h]);
    EXPECT_GT(diff, 1e-3) << "routed experts contributed nothing (fast " << fast << ")";
  }
}

TEST(NumericalTrail, FusedSharedIdsStayInsideWeightRows) {
  // The dispatch counts experts from the weight rows E + S. Every id a fused routing emits must
  // be < E + S, the shared ones exactly E..E+S-1, and expert(id) valid for each.
  for (const char* model : {"deepseek-v3", "qwen2-57b-a14b", "minimax-m3", "deepseek-v2-lite"}) {
    SCOPED_TRACE(model);
    const MoeSpec s = small_spec(model);
    ASSERT_TRUE(s.can_fuse_shared());
    const int E = s.num_experts, S = s.shared_slots(), rows = s.weight_rows(true);
    ASSERT_EQ(rows, E + S);
    const auto w = make_random_weights(s, s.moe_layers.front(), 4);
    std::vector<Bf16> x(static_cast<size_t>(7) * s.hidden);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(std::sin(0.37f * i));
    for (bool fast : {false, true}) {
      const ForwardResult r = fast ? cpu_fast::forward(*w, x.data(), 7, FuseShared::On)
                                   : cpu_reference::forward(*w, x.data(), 7, FuseShared::On);
      ASSERT_TRUE(r.fused);
      ASSERT_EQ(r.routing.slots, s.top_k + S);
      for (int t = 0; t < 7; ++t) {
        for (int j = 0; j < r.routing.slots; ++j) {
          const int id = r.routing.ids[t * r.routing.slots + j];
          ASSERT_GE(id, 0);
          ASSERT_LT(id, rows);
          if (j >= s.top_k) EXPECT_EQ(id, E + (j - s.top_k));
          const ExpertView v = w->expert(id);
          EXPECT_NE(v.w13, nullptr);
          EXPECT_NE(v.w2, nullptr);
        }
      }
    }
    expect_error([&] { w->expert(rows); }, {"expected 0 <= e < " + std::to_string(rows)});
  }
}

TEST(NumericalTrail, TiedKeysNeverYieldDuplicateIds) {
  // Every logit and bias equal: all keys tie, group scores tie. Each token must still get
  // top_k distinct ids (lowest ids of the lowest kept groups), never one id twice.
  const MoeSpec s = small_spec("deepseek-v3");
  HandSetRouter w(make_random_weights(s, s.moe_layers.front(), 13));
  for (int e = 0; e < s.num_experts; ++e) w.set_logit(e, 0.5f);
  const std::vector<Bf16> x = ones(s, 5);
  for (bool fast : {false, true}) {
    const ForwardResult r = fast ? cpu_fast::forward(w, x.data(), 5, FuseShared::On)
                                 : cpu_reference::forward(w, x.data(), 5, FuseShared::On);
    for (int t = 0; t < 5; ++t) {
      std::set<int> seen;
      for (int j = 0; j < r.routing.slots; ++j) {
        const int id = r.routing.ids[t * r.routing.slots + j];
        EXPECT_TRUE(seen.insert(id).second) << "token " << t << " has expert " << id << " twice";
        if (j < s.top_k) EXPECT_EQ(id, j);  // ties: lower group, then lower id
      }
    }
  }
  // Softmax scoring, all logits tied (Qwen3): the same rule.
  const MoeSpec q = small_spec("qwen3-30b-a3b");
  std::vector<float> logits(static_cast<size_t>(3) * q.num_experts, -1.0f);
  const Routing r =
      cpu_reference::route(RoutingConfig::from_spec(q, false), logits.data(), 3, nullptr);
  for (int t = 0; t < 3; ++t) {
    std::set<int> seen(r.ids.begin() + t * r.slots, r.ids.begin() + (t + 1) * r.slots);
    EXPECT_EQ(static_cast<int>(seen.size()), q.top_k);
    EXPECT_EQ(*seen.rbegin(), q.top_k - 1);
  }
}

}  // namespace
}  // namespace moekit
