// `moekit bench stream [--json]`: the bulk-copy stream's ceiling on this GPU (cuda_layer.h
// bench_stream): the bulk expert kernels' weight stream without their math, per copy size, stage
// size, ring depth and CTA order, as GB/s and as a fraction of the read kernel measured before
// and after in the same run. On the H200 one shape's rate moves between runs by up to ~25%
// (src/cuda/bench/stream_probe.cu): compare shapes within one run, and confirm in the layer.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"
#include "token_list.h"

namespace moekit::cli {
namespace {

struct StreamBenchOptions {
  size_t megabytes = 4096;
  int buffers = 1;
  bool json = false;
};

void run_bench_stream(const StreamBenchOptions& o) {
  std::string why;
  MK_CHECK(cuda::available(&why), "bench stream: no usable GPU: " << why);
  const cuda::StreamProbeRun run =
      cuda::bench_stream(cuda::stream_probe_configs(), o.megabytes << 20, 0, o.buffers);
  if (!o.json) {
    std::printf("bulk-copy stream on %s over %d buffer(s) of %zu MB; read kernel %.0f GB/s "
                "before, %.0f after\n",
                run.device.c_str(), run.buffers, run.buffer_bytes >> 20, run.read_gbs_before,
                run.read_gbs_after);
    std::printf("%-62s %6s %8s %6s %6s %11s %4s %9s %7s %7s\n", "stream", "buffer", "stage_KB",
                "copies", "stages", "order", "read", "us", "GB/s", "of_read");
    for (const auto& r : run.records) {
      const auto& c = r.config;
      std::printf("%-62s %6d %8.1f %6d %6d %11s %4s %9.1f %7.0f %7.3f\n", c.name.c_str(),
                  r.buffer, c.rows * static_cast<double>(c.copy_bytes) / 1024, c.rows, c.stages,
                  cuda::stream_order_name(c.order), c.read ? "yes" : "no", r.us, r.gbs, r.of_read);
    }
    return;
  }
  nlohmann::json records = nlohmann::json::array();
  for (const auto& r : run.records) {
    const auto& c = r.config;
    records.push_back({{"stream", c.name},
                       {"buffer", r.buffer},
                       {"rows", c.rows},
                       {"row_bytes", c.row_bytes},
                       {"copy_bytes", c.copy_bytes},
                       {"stages", c.stages},
                       {"order", cuda::stream_order_name(c.order)},
                       {"read", c.read},
                       {"bytes", r.bytes},
                       {"us", r.us},
                       {"gbs", r.gbs},
                       {"of_read", r.of_read}});
  }
  nlohmann::json doc = {{"bench", "stream"},
                        {"device", run.device},
                        {"date", now_utc_iso()},
                        {"command", "moekit bench stream --megabytes " +
                                        std::to_string(o.megabytes) + " --buffers " +
                                        std::to_string(o.buffers) + " --json"},
                        {"timing", "CUDA-graph replay of one launch, median of 15; one CTA per SM"},
                        {"read_gbs_before", run.read_gbs_before},
                        {"read_gbs_after", run.read_gbs_after},
                        {"records", records}};
  std::printf("%s\n", doc.dump(1).c_str());
}

}  // namespace

void add_bench_stream_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand(
      "stream", "The bulk-copy weight stream's ceiling by copy, stage and ring shape");
  auto o = std::make_shared<StreamBenchOptions>();
  cmd->add_option("--megabytes", o->megabytes, "Buffer streamed per launch (MiB)")
      ->check(CLI::Range(size_t{64}, size_t{65536}))
      ->capture_default_str();
  cmd->add_option("--buffers", o->buffers,
                  "Buffers, allocated together, each config timed on each (placement vs drift)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one JSON document instead of the table");
  cmd->callback([o] { run_bench_stream(*o); });
}

}  // namespace moekit::cli
