// `moekit bench --device cuda`: one MoE layer and a decode step on the GPU, fused and unfused
// side by side, with the read bandwidth measured in the same run (src/cuda/bench/bench.cu).
// Prints the table a serving engineer reads; --json prints the records instead.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"

namespace moekit::cli {
namespace {

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

int run_bench_cuda(const BenchOptions& opt) {
  MK_CHECK(opt.weights.empty(), "bench --device cuda times random weights generated on the GPU; "
                                "--weights '" << opt.weights << "' is not supported there");
  MK_CHECK(opt.plot.empty(), "--plot is not available for --device cuda yet (use --json)");
  cuda::GpuBenchOptions b;
  b.model = opt.model;
  b.batches = opt.batches;
  b.fuse = opt.fuse;
  b.seed = opt.seed;
  b.iterations = opt.iterations;
  const std::vector<cuda::GpuBenchRecord> recs = cuda::bench_layer(b, !opt.json);

  if (opt.json) {
    nlohmann::json arr = nlohmann::json::array();
    const std::string date = utc_now();
    for (const auto& r : recs) {
      arr.push_back({{"model", r.model},
                     {"device", "cuda"},
                     {"gpu", r.device},
                     {"date", date},
                     {"batch", r.batch},
                     {"fuse_shared", r.fuse_shared},
                     {"auto_choice", r.auto_choice},
                     {"us_per_layer", r.us_per_layer},
                     {"step_us", r.step_us},
                     {"tokens_per_s", r.tokens_per_s},
                     {"floor_us", r.floor_us},
                     {"bw_fraction", r.bw_fraction},
                     {"touched_bytes", r.touched_bytes},
                     {"read_bw_gbs", r.read_bw_gbs},
                     {"launches", r.launches},
                     {"fused_over_unfused", r.fused_over_unfused},
                     {"layer_sets", r.layer_sets},
                     {"moe_layers", r.moe_layers}});
    }
    std::printf("%s\n", arr.dump(2).c_str());
    return 0;
  }

  if (!recs.empty()) {
    std::printf("%s on %s, read bandwidth %.0f GB/s, %d MoE layers (%d distinct weight sets)\n",
                recs[0].model.c_str(), recs[0].device.c_str(), recs[0].read_bw_gbs,
                recs[0].moe_layers, recs[0].layer_sets);
  }
  std::printf("%6s %5s %5s %12s %10s %8s %12s %12s %9s %9s\n", "batch", "fuse", "auto",
              "us/layer", "floor us", "bw frac", "step us", "tokens/s", "launches", "on/off");
  for (const auto& r : recs) {
    std::printf("%6d %5s %5s %12.1f %10.1f %8.3f %12.0f %12.0f %9d %9.3f\n", r.batch,
                r.fuse_shared.c_str(), r.auto_choice ? "*" : "", r.us_per_layer, r.floor_us,
                r.bw_fraction, r.step_us, r.tokens_per_s, r.launches, r.fused_over_unfused);
  }
  return 0;
}

}  // namespace moekit::cli
