// Helpers of the hostile- and bad-input tests (tests/test_hostile_*.cpp, tests/test_bad_cli.cpp):
// the CLI run as a child process, a tiny config on disk, raw safetensors files written byte by
// byte, a tensor's bytes overwritten in place, and deeply nested JSON text.
#pragma once

#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "io_test_util.h"
#include "moekit/safetensors.h"

namespace moekit::test {

struct CliRun {
  int status = -1;  // exit status, 128 + signal when killed
  std::string err;  // stderr
};

// `moekit <args>` through the shell, stdout discarded; `prefix` runs before it (e.g. ulimit).
inline CliRun run_moekit(const std::string& dir, const std::string& args,
                         const std::string& prefix = "") {
  const std::string err = dir + "/stderr.txt";
  const std::string cmd = prefix + std::string(MOEKIT_CLI_PATH) + " " + args + " >/dev/null 2>" +
                          err;
  const int rc = std::system(cmd.c_str());
  CliRun r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  r.err = read_file(err);
  return r;
}

// A DeepSeek-V3 config with H 64, E 16, I 32 written to dir; returns its path.
inline std::string write_tiny_config(const std::string& dir) {
  nlohmann::json c = model_config("deepseek-v3");
  c["hidden_size"] = 64;
  c["n_routed_experts"] = 16;
  c["moe_intermediate_size"] = 32;
  const std::string path = dir + "/tiny-deepseek.json";
  std::ofstream(path) << c.dump();
  return path;
}

// [8-byte length][header][data], the header padded with spaces to a multiple of 8.
inline void write_raw_safetensors(const std::string& path, std::string header,
                                  const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_file(path, bytes + header + data);
}

// Overwrites `bytes` at byte `offset` of tensor `name`'s data in the safetensors file at path.
inline void poke_tensor(const std::string& path, const std::string& name, size_t offset,
                        const std::string& bytes) {
  size_t at = 0;
  {
    SafetensorsFile f(path);
    ASSERT_TRUE(f.contains(name)) << name;
    ASSERT_LE(offset + bytes.size(), f.info(name).nbytes());
    at = f.info(name).begin;  // within the data section, which starts at 8 + header length
  }
  std::string file = read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(file[i]);
  file.replace(8 + n + at + offset, bytes.size(), bytes);
  write_file(path, file);
}

// "[[[ ... ]]]" nested `depth` levels.
inline std::string nested_array(int depth) {
  return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']');
}

}  // namespace moekit::test
