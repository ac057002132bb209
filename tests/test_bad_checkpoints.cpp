// The bad-input catalogue, checkpoints: safetensors files broken byte by byte (header length,
// JSON header, offsets, shapes, dtypes), and one MoE layer of a small DeepSeek-V3 checkpoint with
// one tensor missing, misshapen or of the wrong dtype, or with a broken index or directory. Each
// is refused with a moekit::Error whose text names the file or tensor and what is wrong with it.
// Each catalogue entry is one ctest case, named after what is wrong.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "expect_error.h"
#include "io_test_util.h"
#include "moekit/checkpoint.h"
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

}  // namespace
}  // namespace moekit
