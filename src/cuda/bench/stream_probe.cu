// The bulk-copy stream's ceiling (cuda_layer.h bench_stream, `moekit bench stream`): the bulk
// expert kernels' weight stream (experts_bulk_kernel.cuh) with their math taken out, so that the
// shape of the stream alone (copy size, stage size, ring depth, the CTAs' order) can be measured
// against the read kernel in the same run.
//
// Why: those kernels stream below the read kernel's bandwidth while their consumer warps wait
// for full stages most of the time (docs/design/gpu_layer.md), and splitting the same bytes into
// more copies changes their speed either way. Whether the ring itself can reach the read
// kernel's rate, and with which copies, decides where to look next. The same shape streams at
// different rates in different runs (a fresh buffer each), so compare within a run; not every
// ranking here carries over to the layer (docs/decisions/experts_bulk_design.md).
//
// The kernel: one CTA per SM (as the expert kernels), 8 consumer warps and 2 producer warps.
// Producer p fills the ring slots of units j = p, p + 2, ... of its CTA: it waits for the slot to
// be free, arms its "full" mbarrier with the unit's bytes and issues the unit's `rows` bulk
// copies, one per lane (rows > 32: two). The consumers wait for a full stage, read every byte of
// it with 16-byte shared loads (when `read`; the XOR of the words is the test's checksum) and
// free it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda/bench/graph_timing.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "cuda/experts/bulk_copy.cuh"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

using experts_detail::bulk_copy;
using experts_detail::mbar_arrive;
using experts_detail::mbar_arrive_expect_tx;
using experts_detail::mbar_init;
using experts_detail::mbar_wait;

constexpr int kConsumerWarps = 8;
constexpr int kProducerWarps = 2;
constexpr int kProbeThreads = (kConsumerWarps + kProducerWarps) * 32;
constexpr int kMaxStages = 8;
constexpr int kMaxRows = 64;
constexpr int kMaxSmem = 227 * 1024;  // sm_90's largest dynamic shared memory per block
constexpr size_t kProbeBytes = size_t{4} << 30;  // as the layer benchmark's read kernel

struct ProbeParams {
  const unsigned char* data;
  int units;           // row blocks x chunks per row
  int rows;
  int row_bytes;
  int copy_bytes;
  int chunks_per_row;  // ceil(row_bytes / copy_bytes)
  int stages;
  int pitch;           // shared-memory bytes per row of a stage
  int order;          // StreamOrder
  int read;
  uint32_t* xor_out;   // the XOR of every word read (atomicXor by each consumer warp)
};

// Rows of a stage at copy_bytes + 64 bytes apart, as the expert kernels' stages (their pitch
// keeps one quarter-warp's 16-byte loads in different banks).
int pitch_of(const StreamProbeConfig& c) { return c.copy_bytes + 64; }
int smem_of(const StreamProbeConfig& c) {
  return c.stages * c.rows * pitch_of(c) + 2 * kMaxStages * 8;
}

__global__ void __launch_bounds__(kProbeThreads, 1) stream_probe_kernel(const ProbeParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int stage_bytes = p.rows * p.pitch;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + p.stages * stage_bytes);
  uint64_t* empty = full + kMaxStages;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(&full[s], 32);                      // every lane of the filling producer
      mbar_init(&empty[s], kConsumerWarps * 32);    // every consumer lane (each read the stage)
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // this CTA's units: unit_of(j) for j < count
  const int b = blockIdx.x, g = gridDim.x;
  int begin, step = 1, count, rotation = 0;
  if (p.order == static_cast<int>(StreamOrder::RoundRobin)) {
    begin = b, step = g, count = b < p.units ? (p.units - 1 - b) / g + 1 : 0;
  } else {
    begin = static_cast<int>(static_cast<long long>(p.units) * b / g);
    count = static_cast<int>(static_cast<long long>(p.units) * (b + 1) / g) - begin;
    if (p.order == static_cast<int>(StreamOrder::RotatedRanges) && count > 0) {
      rotation = static_cast<int>((static_cast<uint32_t>(b) * 2654435761u) % count);
    }
  }
  auto unit_of = [&](int j) {
    const int k = j + rotation;
    return begin + (k < count ? k : k - count) * step;
  };
  auto chunk_len = [&](int unit, int* chunk) {
    *chunk = unit % p.chunks_per_row;
    return min(p.copy_bytes, p.row_bytes - *chunk * p.copy_bytes);
  };

  if (warp >= kConsumerWarps) {
    // as the expert kernels' producers: every lane arrives on "full" (lane 0 with the byte
    // count), then lane r issues the copies of rows r, r + 32, ...
    const int producer = warp - kConsumerWarps;
    for (int j = producer; j < count; j += kProducerWarps) {
      const int s = j % p.stages;
      mbar_wait(&empty[s], ((j / p.stages) & 1) ^ 1);
      const int unit = unit_of(j);
      int chunk;
      const int len = chunk_len(unit, &chunk);
      const long long block = unit / p.chunks_per_row;
      const unsigned char* src =
          p.data + block * p.rows * static_cast<long long>(p.row_bytes) +
          static_cast<long long>(chunk) * p.copy_bytes;
      unsigned char* dst = smem + s * stage_bytes;
      if (lane == 0) {
        mbar_arrive_expect_tx(&full[s], static_cast<uint32_t>(len) * p.rows);
      } else {
        mbar_arrive(&full[s]);
      }
      __syncwarp();  // the byte count is armed before any copy
      for (int r = lane; r < p.rows; r += 32) {
        bulk_copy(dst + r * p.pitch, src + static_cast<long long>(r) * p.row_bytes, len, &full[s]);
      }
    }
    return;
  }
  uint32_t acc = 0;
  for (int j = 0; j < count; ++j) {
    const int s = j % p.stages;
    mbar_wait(&full[s], (j / p.stages) & 1);
    if (p.read) {
      int chunk;
      const int words = chunk_len(unit_of(j), &chunk) / 16;  // per row
      const unsigned char* stage = smem + s * stage_bytes;
      for (int i = threadIdx.x; i < p.rows * words; i += kConsumerWarps * 32) {
        const int r = i / words;
        const uint4 v = *reinterpret_cast<const uint4*>(stage + r * p.pitch + (i - r * words) * 16);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
    }
    mbar_arrive(&empty[s]);
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0 && p.read) atomicXor(p.xor_out, acc);
}

// The launch's parameters for `c` over `bytes` of `data`; *covered: the bytes it streams.
ProbeParams params_for(const StreamProbeConfig& c, const void* data, size_t bytes,
                       uint32_t* xor_out, size_t* covered) {
  check_stream_probe_config(c);
  const size_t block_bytes = static_cast<size_t>(c.rows) * c.row_bytes;
  const size_t blocks = bytes / block_bytes;
  const int chunks = (c.row_bytes + c.copy_bytes - 1) / c.copy_bytes;
  MK_CHECK(blocks >= 1, "stream probe '" << c.name << "': a buffer of " << bytes
                                         << " bytes holds no block of " << block_bytes);
  MK_CHECK(blocks * chunks < (size_t{1} << 31),
           "stream probe '" << c.name << "': " << blocks * chunks << " units (at most 2^31 - 1)");
  *covered = blocks * block_bytes;
  return ProbeParams{static_cast<const unsigned char*>(data), static_cast<int>(blocks * chunks),
                     c.rows, c.row_bytes, c.copy_bytes, chunks, c.stages, pitch_of(c),
                     static_cast<int>(c.order), c.read ? 1 : 0, xor_out};
}

int sm_count(int device) {
  int sms = 0;
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

void launch_probe(const ProbeParams& p, int smem, int grid, cudaStream_t stream) {
  MK_CUDA_CHECK(cudaFuncSetAttribute(stream_probe_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  stream_probe_kernel<<<grid, kProbeThreads, smem, stream>>>(p);
  MK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void check_stream_probe_config(const StreamProbeConfig& c) {
  const std::string what = "stream probe '" + c.name + "': ";
  MK_CHECK(c.rows >= 1 && c.rows <= kMaxRows,
           what << "rows " << c.rows << " (expected 1.." << kMaxRows << ")");
  MK_CHECK(c.copy_bytes >= 16 && c.copy_bytes % 16 == 0,
           what << "copy_bytes " << c.copy_bytes << " (expected a multiple of 16, >= 16)");
  MK_CHECK(c.row_bytes >= c.copy_bytes && c.row_bytes % 16 == 0,
           what << "row_bytes " << c.row_bytes << " (expected a multiple of 16, >= copy_bytes "
                << c.copy_bytes << ")");
  // why >= 2: the two producers take alternate units; with one stage a producer's next unit
  // reuses the slot two phases on, which a parity wait cannot tell from the phase before
  MK_CHECK(c.stages >= kProducerWarps && c.stages <= kMaxStages,
           what << "stages " << c.stages << " (expected " << kProducerWarps << ".." << kMaxStages
                << ")");
  MK_CHECK(smem_of(c) <= kMaxSmem, what << "the ring needs " << smem_of(c)
                                        << " bytes of shared memory (at most " << kMaxSmem
                                        << ")");
}

std::vector<StreamProbeConfig> stream_probe_configs() {
  std::vector<StreamProbeConfig> v = {
      // the expert kernels' stages (experts_bulk_layout.cuh, the standard ring: 2 stages)
      {"down: 16 rows x 4 KB (one copy per row)", 16, 4096, 4096, 2},
      {"down <= 8 tokens: 16 rows x 4 KB in 2 KB copies", 32, 2048, 2048, 2},
      {"gate/up: 16 rows x 4 KB of 14 KB rows", 16, 14336, 4096, 2},
      {"gate/up: 16 rows x 2 KB of 14 KB rows", 16, 14336, 2048, 2},
      {"Qwen3 down: 16 rows x 1.5 KB", 16, 1536, 1536, 2},
      {"Qwen3 down: 16 rows x 1.5 KB, 4 stages", 16, 1536, 1536, 4},
      {"Qwen3 down: 16 rows x 1.5 KB, 8 stages", 16, 1536, 1536, 8},
      // the same without the consumers' reads, and dealt round-robin
      {"down: 16 x 4 KB, no reads", 16, 4096, 4096, 2, StreamOrder::Ranges, false},
      {"gate/up: 16 x 4 KB of 14 KB, no reads", 16, 14336, 4096, 2, StreamOrder::Ranges, false},
      {"down: 16 x 4 KB, round-robin", 16, 4096, 4096, 2, StreamOrder::RoundRobin},
      {"gate/up: 16 x 4 KB of 14 KB, round-robin", 16, 14336, 4096, 2, StreamOrder::RoundRobin},
  };
  // copy size, 64 KB contiguous stages, 2 stages
  for (int copy : {1024, 8192, 16384, 32768, 65536}) {
    v.push_back({"64 KB stages of " + std::to_string(copy / 1024) + " KB copies, 2 stages",
                 65536 / copy, copy, copy, 2});
  }
  // stage size and ring depth, 4 KB copies
  // (24 rows x 2: the bytes of a stage that also holds 8 activation rows)
  const std::pair<int, int> rows_stages[] = {{16, 3}, {24, 2}, {12, 4}, {8, 2},
                                             {8, 4},  {8, 6},  {4, 4},  {4, 8}};
  for (auto [rows, stages] : rows_stages) {
    v.push_back({std::to_string(rows * 4) + " KB stages of 4 KB copies, " +
                     std::to_string(stages) + " stages",
                 rows, 4096, 4096, stages});
  }
  // the shapes the bulk kernels' ring can take (16 weight rows a stage, the mma's M; a stage
  // also holds up to 8 activation rows, so 4 KB chunks fit 2 stages, 2 KB 4, 1 KB 8): down's
  // 4 KB rows and gate/up's 14 KB rows in chunks of 4, 2 or 1 KB
  const std::pair<int, int> chunk_stages[] = {{2048, 2}, {2048, 3}, {2048, 4},
                                              {1024, 4}, {1024, 6}, {1024, 8}};
  for (int row : {4096, 14336}) {
    for (auto [chunk, stages] : chunk_stages) {
      v.push_back({std::string(row == 4096 ? "down" : "gate/up") + ": 16 rows x " +
                       std::to_string(chunk / 1024) + " KB chunks, " + std::to_string(stages) +
                       " stages",
                   16, row, chunk, stages});
    }
  }
  // a control: the CTAs' ranges walked from unrelated offsets
  v.push_back({"down: 16 rows x 4 KB, rotated", 16, 4096, 4096, 2, StreamOrder::RotatedRanges});
  return v;
}

uint32_t stream_probe_checksum(const StreamProbeConfig& c, const void* data, size_t bytes,
                               size_t* covered) {
  StreamProbeConfig cr = c;
  cr.read = true;
  DeviceBuffer x(sizeof(uint32_t));
  MK_CUDA_CHECK(cudaMemset(x.ptr, 0, sizeof(uint32_t)));
  int device = 0;
  MK_CUDA_CHECK(cudaGetDevice(&device));
  launch_probe(params_for(cr, data, bytes, x.as<uint32_t>(), covered), smem_of(cr),
               sm_count(device), nullptr);
  uint32_t h = 0;
  MK_CUDA_CHECK(cudaMemcpy(&h, x.ptr, sizeof h, cudaMemcpyDeviceToHost));
  return h;
}

StreamProbeRun bench_stream(const std::vector<StreamProbeConfig>& configs, size_t bytes,
                            int device, int buffers) {
  using bench_timing::capture;
  using bench_timing::Graph;
  using bench_timing::Stream;
  using bench_timing::time_graph;
  for (const auto& c : configs) check_stream_probe_config(c);
  MK_CHECK(buffers >= 1 && buffers <= 8, "bench_stream: buffers " << buffers << " (expected 1..8)");
  if (bytes == 0) bytes = kProbeBytes;
  MK_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  StreamProbeRun run;
  run.device = prop.name;
  run.buffer_bytes = bytes;
  run.buffers = buffers;
  run.read_gbs_before = measure_read_bandwidth(bytes, device);
  {
    std::vector<std::unique_ptr<DeviceBuffer>> bufs;
    for (int b = 0; b < buffers; ++b) {
      bufs.push_back(std::make_unique<DeviceBuffer>(bytes));
      // why not zeros: never time on zeros (METHOD.md)
      MK_CUDA_CHECK(cudaMemset(bufs.back()->ptr, 0x5a, bytes));
    }
    DeviceBuffer sink(sizeof(uint32_t));
    const int grid = sm_count(device);
    Stream stream;
    for (const auto& c : configs) {
      for (int b = 0; b < buffers; ++b) {
        StreamProbeRecord r;
        r.config = c;
        r.buffer = b;
        const ProbeParams p =
            params_for(c, bufs[b]->ptr, bytes, sink.as<uint32_t>(), &r.bytes);
        Graph g;
        capture(g, stream.s, [&] { launch_probe(p, smem_of(c), grid, stream.s); });
        r.us = time_graph(g, stream.s, 15, 2);
        r.gbs = static_cast<double>(r.bytes) / (r.us * 1e3);
        run.records.push_back(r);
      }
    }
  }
  run.read_gbs_after = measure_read_bandwidth(bytes, device);
  const double read = (run.read_gbs_before + run.read_gbs_after) / 2;
  for (auto& r : run.records) r.of_read = r.gbs / read;
  return run;
}

}  // namespace moekit::cuda
