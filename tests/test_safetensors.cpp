// safetensors: every dtype round-trips through write_safetensors / SafetensorsFile, and every kind
// of malformed file is refused at open with a message naming the file and the tensor or key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io_test_util.h"
#include "moekit/error.h"
#include "moekit/safetensors.h"

using moekit::DType;
using moekit::SafetensorsFile;
using moekit::SafetensorsWriteTensor;
using moekit::test::scratch_dir;
using ::testing::HasSubstr;

namespace {

// A file with an arbitrary header text and data bytes; header_len overrides the length field.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes,
               int64_t header_len = -1) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = header_len >= 0 ? uint64_t(header_len) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header;
  out << std::string(data_bytes, '\x11');
}

// Opening `path` throws, and the message contains every fragment.
void expect_open_error(const std::string& path, std::vector<std::string> fragments) {
  try {
    SafetensorsFile f(path);
    FAIL() << "expected " << path << " to be refused";
  } catch (const moekit::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(path));
    for (const auto& frag : fragments) EXPECT_THAT(e.what(), HasSubstr(frag));
  }
}

TEST(Safetensors, RoundTripEveryDtype) {
  const std::string dir = scratch_dir();
  const std::string path = dir + "/t.safetensors";
  std::vector<uint16_t> bf16(6), f16(5);
  std::vector<float> f32(7);
  std::vector<uint8_t> f8(9);  // odd sizes: the writer's order keeps every tensor aligned
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = moekit::float_to_bf16(0.5f * i - 1).bits;
  for (size_t i = 0; i < f16.size(); ++i) f16[i] = moekit::float_to_f16(0.25f * i);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = 1.0f / (i + 1);
  for (size_t i = 0; i < f8.size(); ++i) f8[i] = moekit::float_to_fp8_e4m3(float(i) - 4);
  float scalar = 42.0f;
  std::map<std::string, SafetensorsWriteTensor> tensors;
  tensors["a.f8"] = {DType::F8_E4M3, {3, 3}, moekit::as_bytes_span(f8.data(), f8.size())};
  tensors["b.bf16"] = {DType::BF16, {2, 3}, moekit::as_bytes_span(bf16.data(), bf16.size())};
  tensors["c.f16"] = {DType::F16, {5}, moekit::as_bytes_span(f16.data(), f16.size())};
  tensors["d.f32"] = {DType::F32, {7, 1}, moekit::as_bytes_span(f32.data(), f32.size())};
  tensors["e.scalar"] = {DType::F32, {}, moekit::as_bytes_span(&scalar, 1)};
  tensors["f.empty"] = {DType::BF16, {0, 4}, {}};
  moekit::write_safetensors(path, tensors, {{"format", "pt"}, {"note", "moekit test"}});

  SafetensorsFile f(path);
  EXPECT_EQ(f.names(),
            (std::vector<std::string>{"a.f8", "b.bf16", "c.f16", "d.f32", "e.scalar", "f.empty"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "moekit test");
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    EXPECT_EQ(f.dtype(name), t.dtype);
    EXPECT_EQ(f.shape(name), t.shape);
    ASSERT_EQ(f.info(name).nbytes(), t.bytes.size());
    if (!t.bytes.empty()) {
      EXPECT_EQ(std::memcmp(f.data(name), t.bytes.data(), t.bytes.size()), 0);
    }
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data(name)) % moekit::dtype_size(t.dtype), 0u);
  }
  EXPECT_EQ(f.info("d.f32").numel(), 7u);
  EXPECT_EQ(f.info("e.scalar").numel(), 1u);
  EXPECT_EQ(*static_cast<const float*>(f.data("e.scalar")), 42.0f);
  EXPECT_EQ(moekit::load_as_float(DType::BF16, f.data("b.bf16"), 5), 1.5f);
  // Header length is padded to 8 bytes, like the Python writer.
  EXPECT_EQ((f.file_size() - 8 - (6 * 2 + 5 * 2 + 7 * 4 + 4 + 9)) % 8, 0u);

  // Moving keeps the mapping alive.
  SafetensorsFile g = std::move(f);
  EXPECT_EQ(*static_cast<const float*>(g.data("e.scalar")), 42.0f);
}

// A tensor's data may sit at any byte offset of a file (the format does not align it):
// load_as_float reads each dtype at an odd address (UBSan, in the hardening run, reports a typed
// load there; fuzz_safetensors found one for F32).
TEST(Safetensors, LoadAsFloatReadsUnalignedValues) {
  alignas(8) uint8_t buf[1 + 2 * 4];
  uint8_t* odd = buf + 1;
  const float f[2] = {1.25f, -3.5f};
  std::memcpy(odd, f, sizeof f);
  EXPECT_EQ(moekit::load_as_float(DType::F32, odd, 1), -3.5f);
  const moekit::Bf16 b[2] = {moekit::float_to_bf16(0.5f), moekit::float_to_bf16(-2.0f)};
  std::memcpy(odd, b, sizeof b);
  EXPECT_EQ(moekit::load_as_float(DType::BF16, odd, 1), -2.0f);
  const uint16_t h[2] = {moekit::float_to_f16(0.75f), moekit::float_to_f16(6.0f)};
  std::memcpy(odd, h, sizeof h);
  EXPECT_EQ(moekit::load_as_float(DType::F16, odd, 1), 6.0f);
}

TEST(Safetensors, WriterRejectsWrongByteCount) {
  const std::string path = scratch_dir() + "/w.safetensors";
  std::vector<uint16_t> v(5);
  std::map<std::string, SafetensorsWriteTensor> tensors;
  tensors["x"] = {DType::BF16, {2, 3}, moekit::as_bytes_span(v.data(), v.size())};
  try {
    moekit::write_safetensors(path, tensors);
    FAIL() << "expected an error";
  } catch (const moekit::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 'x' for " + path));
    EXPECT_THAT(e.what(), HasSubstr("needs 12 bytes, got 10"));
  }
}

TEST(Safetensors, MissingFile) {
  expect_open_error(scratch_dir() + "/nothing.safetensors", {"cannot open safetensors file"});
}

TEST(Safetensors, TruncatedBeforeHeaderLength) {
  const std::string path = scratch_dir() + "/short.safetensors";
  std::ofstream(path) << "abc";
  expect_open_error(path, {"is truncated: 3 bytes"});
}

TEST(Safetensors, HeaderLengthBeyondFile) {
  const std::string path = scratch_dir() + "/len.safetensors";
  write_raw(path, "{}", 0, 1000);
  expect_open_error(path, {"header length 1000 exceeds the file size 10"});
}

TEST(Safetensors, HeaderLengthBeyondSaneMaximum) {
  const std::string path = scratch_dir() + "/huge.safetensors";
  write_raw(path, "{}", 0, (100ll << 20) + 1);
  std::filesystem::resize_file(path, (100ull << 20) + 64);  // sparse: no real disk use
  expect_open_error(path, {"exceeds the sane maximum of 104857600 bytes"});
}

TEST(Safetensors, InvalidJson) {
  const std::string path = scratch_dir() + "/json.safetensors";
  write_raw(path, R"({"x": {"dtype": "BF16", "shape": [1], )", 2);
  expect_open_error(path, {"invalid JSON header"});
  write_raw(path, R"([1, 2, 3])", 0);
  expect_open_error(path, {"expected the header to be a JSON object, got array"});
}

TEST(Safetensors, OffsetsOutOfRange) {
  const std::string path = scratch_dir() + "/range.safetensors";
  write_raw(path, R"({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}})", 6);
  expect_open_error(path, {"tensor 'w'", "data_offsets [0, 8] out of range", "holds 6 bytes"});
  write_raw(path, R"({"w": {"dtype": "BF16", "shape": [0], "data_offsets": [6, 2]}})", 6);
  expect_open_error(path, {"tensor 'w'", "begin 6 > end 2"});
  write_raw(path, R"({"w": {"dtype": "BF16", "shape": [1], "data_offsets": [-2, 0]}})", 6);
  expect_open_error(path, {"tensor 'w'", "expected 'data_offsets' [begin, end]"});
}

TEST(Safetensors, ByteSpanMustMatchShape) {
  const std::string path = scratch_dir() + "/span.safetensors";
  write_raw(path, R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 24);
  expect_open_error(path,
                    {"tensor 'w'", "shape [2, 3] of F32 needs 24 bytes, data_offsets span 20"});
  // Known but unsupported dtypes are size-checked too.
  write_raw(path, R"({"ids": {"dtype": "I64", "shape": [3], "data_offsets": [0, 16]}})", 24);
  expect_open_error(path, {"tensor 'ids'", "of I64 needs 24 bytes"});
}

TEST(Safetensors, ShapeOverflow) {
  const std::string path = scratch_dir() + "/overflow.safetensors";
  write_raw(
      path,
      R"({"w": {"dtype": "BF16", "shape": [4611686018427387904, 8], "data_offsets": [0, 0]}})", 0);
  expect_open_error(path, {"tensor 'w'", "overflows 64 bits"});
  write_raw(path, R"({"w": {"dtype": "BF16", "shape": [2, -1], "data_offsets": [0, 0]}})", 0);
  expect_open_error(path, {"tensor 'w'", "non-negative integer dimensions"});
}

TEST(Safetensors, MalformedEntries) {
  const std::string path = scratch_dir() + "/entries.safetensors";
  write_raw(path, R"({"w": {"shape": [1], "data_offsets": [0, 2]}})", 2);
  expect_open_error(path, {"tensor 'w'", "expected a string 'dtype', got none"});
  write_raw(path, R"({"w": {"dtype": "BF16", "shape": 3, "data_offsets": [0, 2]}})", 2);
  expect_open_error(path, {"tensor 'w'", "expected an array 'shape', got 3"});
  write_raw(path, R"({"w": [1, 2]})", 2);
  expect_open_error(path, {"tensor 'w'", "expected an object"});
  write_raw(path, R"({"__metadata__": {"format": 5}})", 0);
  expect_open_error(path, {"__metadata__ key 'format' must map to a string"});
}

TEST(Safetensors, UnknownAndUnsupportedDtypesAreListedButRefusedOnAccess) {
  const std::string path = scratch_dir() + "/dtypes.safetensors";
  write_raw(path,
            R"({"q": {"dtype": "Q7", "shape": [3], "data_offsets": [0, 5]},)"
            R"( "ids": {"dtype": "I64", "shape": [1], "data_offsets": [5, 13]},)"
            R"( "ok": {"dtype": "BF16", "shape": [1], "data_offsets": [13, 15]}})",
            15);
  SafetensorsFile f(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"ids", "ok", "q"}));
  EXPECT_EQ(f.info("q").dtype_name, "Q7");
  EXPECT_FALSE(f.info("q").dtype_supported);
  EXPECT_EQ(f.dtype("ok"), DType::BF16);
  for (const char* name : {"q", "ids"}) {
    try {
      f.data(name);
      FAIL() << "expected an error for " << name;
    } catch (const moekit::Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(std::string("tensor '") + name + "' in " + path));
      EXPECT_THAT(e.what(), HasSubstr("which moekit does not read"));
    }
  }
  EXPECT_NE(f.raw_data("ids"), nullptr);
}

TEST(Safetensors, MissingTensorNamesFileAndTensor) {
  const std::string path = scratch_dir() + "/missing.safetensors";
  write_raw(path, R"({"a": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}})", 2);
  SafetensorsFile f(path);
  EXPECT_TRUE(f.contains("a"));
  EXPECT_FALSE(f.contains("b"));
  try {
    f.info("b");
    FAIL();
  } catch (const moekit::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 'b' not found in " + path));
  }
}

TEST(Safetensors, TruncatedDataSection) {
  const std::string path = scratch_dir() + "/trunc.safetensors";
  std::vector<float> v(64, 1.0f);
  std::map<std::string, SafetensorsWriteTensor> tensors;
  tensors["first"] = {DType::F32, {32}, moekit::as_bytes_span(v.data(), 32)};
  tensors["second"] = {DType::F32, {32}, moekit::as_bytes_span(v.data() + 32, 32)};
  moekit::write_safetensors(path, tensors);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  expect_open_error(path, {"tensor 'second'", "out of range", "file truncated?"});
}

}  // namespace
