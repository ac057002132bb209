// The bulk-copy stream probe (cuda_layer.h bench_stream): its configs are checked with errors
// that name the problem (no GPU needed), and on a GPU every config's consumers read exactly the
// bytes it claims to stream (the XOR of their words against the host's over the same bytes, on
// random data: a unit missed, read twice or read from the wrong place changes it).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../expect_error.h"
#include "moekit/cuda_layer.h"

namespace moekit {
namespace {

using test::expect_error;

TEST(StreamProbe, BuiltInConfigsAreLegal) {
  const auto configs = cuda::stream_probe_configs();
  ASSERT_GE(configs.size(), 10u);
  for (const auto& c : configs) EXPECT_NO_THROW(cuda::check_stream_probe_config(c)) << c.name;
}

TEST(StreamProbe, BadConfigsAreNamed) {
  auto bad = [](auto edit, std::vector<std::string> fragments) {
    cuda::StreamProbeConfig c{"probe x"};
    edit(c);
    fragments.push_back("stream probe 'probe x'");
    expect_error([&] { cuda::check_stream_probe_config(c); }, fragments);
  };
  bad([](auto& c) { c.rows = 0; }, {"rows 0"});
  bad([](auto& c) { c.rows = 65; }, {"rows 65"});
  bad([](auto& c) { c.copy_bytes = 24; }, {"copy_bytes 24", "multiple of 16"});
  bad([](auto& c) { c.row_bytes = 2048; }, {"row_bytes 2048", ">= copy_bytes 4096"});
  bad([](auto& c) { c.stages = 9; }, {"stages 9"});
  bad([](auto& c) { c.stages = 1; }, {"stages 1", "expected 2..8"});
  bad([](auto& c) { c.stages = 4; }, {"shared memory"});  // 4 x 16 x 4 KB
}

TEST(StreamProbe, BufferCountOutOfRangeIsNamed) {
  // (checked before any CUDA call: runs without a GPU)
  for (int buffers : {0, 9}) {
    expect_error([&] { cuda::bench_stream(cuda::stream_probe_configs(), 1 << 26, 0, buffers); },
                 {"buffers " + std::to_string(buffers), "expected 1..8"});
  }
}

uint32_t host_xor(const std::vector<uint32_t>& words, size_t bytes) {
  uint32_t x = 0;
  for (size_t i = 0; i < bytes / 4; ++i) x ^= words[i];
  return x;
}

TEST(StreamProbe, ConsumersReadExactlyTheStreamedBytes) {
  std::string why;
  if (!cuda::available(&why)) GTEST_SKIP() << "no usable GPU: " << why;
  // 40 MB + 48 KB: no config's row blocks divide it, so each leaves a tail it must not read
  const size_t bytes = (size_t{40} << 20) + 48 * 1024;
  std::vector<uint32_t> h(bytes / 4);
  std::mt19937 rng(20261130);
  for (auto& w : h) w = rng();
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, h.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<cuda::StreamProbeConfig> configs = cuda::stream_probe_configs();
  configs.push_back({"one row per stage", 1, 4096, 4096, 2});
  configs.push_back({"rows of 3 chunks, the last shorter, 3 stages", 5, 4096 + 2048 + 16, 2048, 3});
  for (const auto& c : configs) {
    size_t covered = 0;
    const uint32_t got = cuda::stream_probe_checksum(c, d, bytes, &covered);
    EXPECT_GT(covered, bytes - static_cast<size_t>(c.rows) * c.row_bytes) << c.name;
    EXPECT_LE(covered, bytes) << c.name;
    EXPECT_EQ(got, host_xor(h, covered)) << c.name;
  }
  // the check can fail: one bit changed in the streamed bytes changes the checksum
  size_t covered = 0;
  const uint32_t before = cuda::stream_probe_checksum(configs.front(), d, bytes, &covered);
  const uint32_t flipped = h[12345] ^ 0x100u;
  ASSERT_EQ(cudaMemcpy(static_cast<uint32_t*>(d) + 12345, &flipped, 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cuda::stream_probe_checksum(configs.front(), d, bytes, &covered), before ^ 0x100u);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

}  // namespace
}  // namespace moekit
