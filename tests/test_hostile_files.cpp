// Hostile and careless files (issue 35): FIFOs, devices and directories where a file is expected
// (refused without blocking), JSON inputs beyond their size limit, a checkpoint truncated while it
// is mapped (an error, not SIGBUS), overlapping tensor spans, control characters in names.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "expect_error.h"
#include "hostile_util.h"
#include "io/checkpoint_dir.h"
#include "moekit/checkpoint.h"
#include "moekit/safetensors.h"
#include "moekit/spec.h"
#include "moekit/tuning.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using test::scratch_dir;

// A FIFO nobody writes to: a blocking open would wait forever (ctest's timeout bounds the test).
std::string make_fifo(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  return path;
}

TEST(HostileFiles, FifoAsConfig) {
  const std::string fifo = make_fifo(scratch_dir(), "config.json");
  expect_error([&] { load_spec(fifo); }, {"config file", fifo, "is a FIFO (named pipe)"});
}

TEST(HostileFiles, DevZeroAsConfig) {
  expect_error([] { load_spec("/dev/zero"); },
               {"config file /dev/zero is a character device, expected a regular file"});
}

TEST(HostileFiles, FifoAsSafetensorsFileAndIndexEntry) {
  const std::string dir = scratch_dir();
  const std::string fifo = make_fifo(dir, "model-00001.safetensors");
  expect_error([&] { SafetensorsFile f(fifo); }, {"safetensors file", "is a FIFO"});
  test::write_file(dir + "/model.safetensors.index.json",
                   R"({"weight_map": {"w": "model-00001.safetensors"}})");
  io::CheckpointDir d(dir);
  expect_error([&] { d.find("w"); }, {"model-00001.safetensors is a FIFO"});
}

TEST(HostileFiles, FifoAsIndexAndAsCheckpointPath) {
  const std::string dir = scratch_dir();
  make_fifo(dir, "model.safetensors.index.json");
  expect_error([&] { io::CheckpointDir d(dir); }, {"checkpoint index", "is a FIFO"});
  const std::string fifo = make_fifo(dir, "weights");
  expect_error([&] { io::CheckpointDir d(fifo); },
               {"checkpoint path", "is a FIFO (named pipe), expected a directory"});
}

TEST(HostileFiles, FifoAsTuningFile) {
  const std::string fifo = make_fifo(scratch_dir(), "table.json");
  expect_error([&] { tuning::load_tuning_file(fifo); }, {"tuning file", "is a FIFO"});
}

TEST(HostileFiles, DirectoryAsSafetensorsFile) {
  const std::string dir = scratch_dir() + "/x.safetensors";
  fs::create_directories(dir);
  expect_error([&] { SafetensorsFile f(dir); }, {"is a directory, expected a regular file"});
}

TEST(HostileFiles, ConfigBeyondSizeLimit) {
  // A sparse file: 17 MB long, no disk blocks.
  const std::string path = scratch_dir() + "/huge.json";
  test::write_file(path, "{");
  ASSERT_EQ(::truncate(path.c_str(), 17 << 20), 0);
  expect_error([&] { load_spec(path); },
               {"config file", "is 17825792 bytes, more than the 16777216 bytes"});
}

TEST(HostileFiles, OverlappingAndAliasedSpans) {
  const std::string dir = scratch_dir();
  const std::string overlap = dir + "/overlap.safetensors";
  test::write_raw_safetensors(overlap,
                              R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                              R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                              std::string(12, '\0'));
  expect_error([&] { SafetensorsFile f(overlap); },
               {"tensors 'a' [0, 8) and 'b' [4, 12) overlap in the data section"});
  const std::string alias = dir + "/alias.safetensors";
  test::write_raw_safetensors(alias,
                              R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                              R"( "b": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}})",
                              std::string(8, '\0'));
  expect_error([&] { SafetensorsFile f(alias); }, {"'a' [0, 8) and 'b' [0, 8) overlap"});
  // Empty tensors take no bytes; adjacent spans and gaps are fine.
  const std::string ok = dir + "/ok.safetensors";
  test::write_raw_safetensors(ok,
                              R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},)"
                              R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                              R"( "c": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                              std::string(12, '\0'));
  EXPECT_NO_THROW(SafetensorsFile f(ok));
}

TEST(HostileFiles, ControlCharactersInNamesAreEscaped) {
  const std::string path = scratch_dir() + "/names.safetensors";
  test::write_raw_safetensors(
      path, "{\"evil\\u001b[2J\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 4]}}",
      std::string(4, '\0'));
  try {
    SafetensorsFile f(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tensor 'evil\\x1b[2J'"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\x1b'), std::string::npos) << "raw ESC in: " << msg;
  }
}

TEST(HostileFiles, CheckpointTruncatedAfterLoadIsAnErrorNotSigbus) {
  const MoeSpec spec = test::small_spec("deepseek-v3");
  const int layer = spec.moe_layers.front();
  const std::string dir = scratch_dir();
  const std::string file = save_checkpoint(*make_random_weights(spec, layer, 3), dir);
  const auto w = load_checkpoint_weights(spec, layer, dir);  // experts not read yet
  const size_t size = fs::file_size(file);
  ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(size / 4)), 0);
  expect_error([&] { w->expert(spec.num_experts - 1); },
               {"was truncated after it was opened", "its tensors can no longer be read"});
  // Restored to its length (with zeros), reads work again.
  ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(size)), 0);
  EXPECT_NO_THROW(w->expert(spec.num_experts - 1));
}

}  // namespace
}  // namespace moekit
