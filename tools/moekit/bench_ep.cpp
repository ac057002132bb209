// `moekit bench --ep N --model M [--batch ...] [--ep-transport nccl|local] [--ep-mode ...]`: the
// expert-parallel layer over N ranks (one process driving N GPUs, or every rank on one GPU),
// per phase, the bytes on the links, the link's fraction and NCCL's all-to-all of the same bytes
// (moekit/ep_bench.h). Prints a table; --json prints the records.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli_context.h"
#include "commands.h"
#include "moekit/ep_bench.h"

namespace moekit::cli {

int run_bench_ep(const BenchOptions& opt, const EpCliOptions& ep) {
  ep::EpBenchOptions b;
  b.model = opt.model;
  b.world = ep.world;
  b.transport = ep.transport == "local" ? ep::Transport::Local : ep::Transport::Nccl;
  b.batches = opt.batches;
  b.modes.clear();
  if (ep.mode != "throughput") b.modes.push_back(ep::Mode::LowLatency);
  if (ep.mode != "low-latency") b.modes.push_back(ep::Mode::Throughput);
  b.seed = opt.seed;
  b.iterations = opt.iterations;
  const std::vector<ep::EpBenchRecord> recs = ep::bench_ep(b, !opt.json);

  if (opt.json) {
    nlohmann::json arr = nlohmann::json::array();
    const std::string date = utc_now();
    for (const auto& r : recs) {
      const ep::RankStats& s = r.slowest;
      arr.push_back({{"model", r.model},
                     {"gpu", r.device},
                     {"date", date},
                     {"transport", r.transport},
                     {"mode", r.mode},
                     {"world", r.world},
                     {"tokens_per_rank", r.tokens_per_rank},
                     {"us_per_forward", r.us_per_forward},
                     {"route_us", s.route_us},
                     {"home_us", s.home_us},
                     {"pack_us", s.pack_us},
                     {"counts_us", s.counts_us},
                     {"dispatch_us", s.dispatch_us},
                     {"remote_us", s.remote_us},
                     {"return_us", s.return_us},
                     {"combine_us", s.combine_us},
                     {"rank_total_us", s.total_us},
                     {"busiest_dispatch_bytes", s.dispatch_bytes},
                     {"busiest_return_bytes", s.return_bytes},
                     {"link_bytes", r.link_bytes},
                     {"link_gbs", r.link_gbs},
                     {"exchange_us", r.exchange_us},
                     {"exchange_floor_us", r.exchange_floor_us},
                     {"link_fraction", r.link_fraction},
                     {"alltoall_us", r.alltoall_us},
                     {"single_gpu_us", r.single_gpu_us},
                     {"rel_error", r.rel_error},
                     {"command", command_line()}});
    }
    std::printf("%s\n", arr.dump(2).c_str());
    return 0;
  }
  if (!recs.empty()) {
    std::printf("%s, %d ranks over %s on %s, link %.0f GB/s (phases: the slowest rank's us)\n",
                recs[0].model.c_str(), recs[0].world, recs[0].transport.c_str(),
                recs[0].device.c_str(), recs[0].link_gbs);
  }
  std::printf("%-11s %6s %9s %7s %7s %6s %6s %8s %7s %7s %7s %10s %6s %9s %9s %8s\n", "mode",
              "T/rank", "us/fwd", "route", "home", "pack", "counts", "dispatch", "remote", "return",
              "combine", "link bytes", "frac", "all2all", "1 GPU", "rel err");
  for (const auto& r : recs) {
    const ep::RankStats& s = r.slowest;
    std::printf(
        "%-11s %6d %9.1f %7.1f %7.1f %6.1f %6.1f %8.1f %7.1f %7.1f %7.1f %10.0f %6.3f "
        "%9.1f %9.1f %8.1e\n",
        r.mode.c_str(), r.tokens_per_rank, r.us_per_forward, s.route_us, s.home_us, s.pack_us,
        s.counts_us, s.dispatch_us, s.remote_us, s.return_us, s.combine_us, r.link_bytes,
        r.link_fraction, r.alltoall_us, r.single_gpu_us, r.rel_error);
  }
  return 0;
}

}  // namespace moekit::cli
