// `moekit bench router-gemm --model M [--batch 1-128] [--json] [--tuning-file F]`: the router GEMM
// as the layer runs it (the tuned dispatch) against cuBLAS, in the same run, per M: microseconds,
// the speed-up over cuBLAS, GB/s and the fraction of the floor, and the config chosen.
// Standalone (ours_us, x_cublas, GB/s, of_floor): launched without PDL, as `moekit tune` times its
// candidates, so the ratio is the one the tuner's choice rule guarantees (>= 1/0.97 where ours is
// chosen). pdl_us / x_pdl: with PDL, each launch following another router GEMM (which triggers
// its dependents only after its own wait).
// In the step (step_us, cublas_step, x_step, of_step_floor): what one launch adds to a decode step
// in which it follows the previous layer's expert kernel (RouterGemmTimer::time_in_step_us: a
// stand-in that streams HBM, lets its dependents launch at once and writes x last): ours with PDL
// (weights loaded under the stand-in), cuBLAS as it launches. The layer's situation.
// Floor = (bytes of Wg + x + out) / 4.535e12 B/s (the H200's measured read bandwidth, DESIGN.md
// §8) + the time of an empty kernel measured here by the same graph method (the launch share);
// the step floor is the bytes term alone (the launch is hidden under the previous kernel), and
// empty_kernel_step_us (an empty PDL kernel that waits, timed in the step) is the boundary every
// dependent kernel pays there.
// Timing: RouterGemmTimer (CUDA-graph replay, weights rotated out of L2). Before timing, the
// dispatch's output is checked against cuBLAS.
#include <cmath>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "moekit/error.h"
#include "moekit/router_gemm.h"
#include "moekit/spec.h"
#include "moekit/tuning.h"
#include "token_list.h"

namespace moekit::cli {
namespace {

constexpr double kReadBandwidth = 4.535e12;  // B/s, H200 read-only stream (DESIGN.md §8)

struct RouterBenchOptions {
  std::string model;
  std::string batches = "1-128";
  std::string tuning_file;
  uint64_t seed = 0;
  bool json = false;
};

int run_bench_router_gemm(const RouterBenchOptions& o) {
  MK_CHECK(!o.model.empty(), "bench router-gemm: --model is required");
  if (!o.tuning_file.empty()) tuning::set_tuning_file(o.tuning_file);
  const std::vector<int> ms = parse_token_list(o.batches, "--batch");
  const MoeSpec spec = load_spec(o.model);
  const cuda::RouterGemmDeviceInfo dev = cuda::router_gemm_device_info();
  const tuning::RouterGemmConfig cublas{tuning::RouterGemmBackend::Cublas, 0, 0, 0, 1};
  nlohmann::json records = nlohmann::json::array();
  int mismatches = 0;
  for (const tuning::RouterGemmShape& shape : tuning::router_gemm_shapes(spec)) {
    cuda::RouterGemmTimer timer(shape, ms.back(), o.seed);
    const double empty_us = timer.time_empty_us();
    const double empty_step_us = timer.time_in_step_empty_us();
    if (!o.json) {
      std::printf("router GEMM %s, %s, %zu MoE layer(s), %s (%s), %d weight copies, empty "
                  "kernel %.2f us, in the step (PDL, waiting) %.2f us\n",
                  spec.name.c_str(), tuning::describe(shape).c_str(), spec.moe_layers.size(),
                  dev.name.c_str(), tuning::arch_name(dev.arch), timer.copies(), empty_us,
                  empty_step_us);
      std::printf("%5s %8s %8s %9s %7s %7s %7s %8s %8s %8s %11s %7s %8s  %s\n", "M", "ours_us",
                  "pdl_us", "cublas_us", "x_cublas", "x_pdl", "GB/s", "floor_us", "of_floor",
                  "step_us", "cublas_step", "x_step", "of_step", "config (source)");
    }
    for (int m : ms) {
      const tuning::RouterGemmChoice choice =
          tuning::choose_router_gemm(dev.arch, shape.weight_dtype, shape.k, shape.n, m);
      const double diff =
          max_relative_difference(timer.run(choice.config, m), timer.run(cublas, m));
      if (!(diff <= 1e-4)) {
        // Reported and counted, not fatal: the timings of the other M still come out.
        std::fprintf(stderr, "moekit bench router-gemm: '%s' disagrees with cuBLAS on %s M=%d "
                     "(max relative difference %g)\n", tuning::describe(choice.config).c_str(),
                     tuning::describe(shape).c_str(), m, diff);
        ++mismatches;
      }
      // Ours without PDL (the fair headline, timed as the tuner times) and with it (in the
      // graph each launch then follows another router GEMM, which triggers its dependents
      // early: the best case).
      const bool pdl_default = cuda::router_gemm_pdl();
      cuda::set_router_gemm_pdl(false);
      const double ours = timer.time_dispatch_us(m);
      cuda::set_router_gemm_pdl(true);
      const double ours_pdl = timer.time_dispatch_us(m);
      const double ours_step = timer.time_in_step_us(nullptr, m);
      cuda::set_router_gemm_pdl(pdl_default);
      const double theirs = timer.time_config_us(cublas, m);
      const double theirs_step = timer.time_in_step_us(&cublas, m);
      const double bytes = timer.bytes(m);
      const double step_floor_us = bytes / kReadBandwidth * 1e6;
      const double floor_us = step_floor_us + empty_us;
      std::ostringstream cfg;
      cfg << tuning::describe(choice.config) << " (" << tuning::source_name(choice.source) << ")";
      if (o.json) {
        records.push_back({{"model", spec.name},
                           {"dtype", dtype_name(shape.weight_dtype)},
                           {"k", shape.k},
                           {"n", shape.n},
                           {"bias", shape.has_bias},
                           {"m", m},
                           {"ours_us", ours},
                           {"ours_pdl_us", ours_pdl},
                           {"cublas_us", theirs},
                           {"speedup_vs_cublas", theirs / ours},
                           {"speedup_vs_cublas_pdl", theirs / ours_pdl},
                           {"ours_step_us", ours_step},
                           {"cublas_step_us", theirs_step},
                           {"speedup_vs_cublas_step", theirs_step / ours_step},
                           {"step_floor_us", step_floor_us},
                           {"fraction_of_step_floor", step_floor_us / ours_step},
                           {"gb_per_s", bytes / ours * 1e-3},
                           {"floor_us", floor_us},
                           {"fraction_of_floor", floor_us / ours},
                           {"bytes", bytes},
                           {"empty_kernel_us", empty_us},
                           {"empty_kernel_step_us", empty_step_us},
                           {"backend", tuning::backend_name(choice.config.backend)},
                           {"config", tuning::describe(choice.config)},
                           {"config_source", tuning::source_name(choice.source)},
                           {"max_rel_diff_vs_cublas", diff}});
      } else {
        std::printf("%5d %8.2f %8.2f %9.2f %6.2fx %6.2fx %7.0f %8.2f %7.0f%% %8.2f %11.2f %6.2fx "
                    "%7.0f%%  %s\n",
                    m, ours, ours_pdl, theirs, theirs / ours, theirs / ours_pdl,
                    bytes / ours * 1e-3, floor_us, 100 * floor_us / ours, ours_step, theirs_step,
                    theirs_step / ours_step, 100 * step_floor_us / ours_step, cfg.str().c_str());
      }
    }
  }
  if (o.json) {
    std::ostringstream cmd;
    cmd << "moekit bench router-gemm --model " << o.model << " --batch " << o.batches;
    nlohmann::json doc = {{"bench", "router-gemm"},
                          {"device", dev.name},
                          {"arch", tuning::arch_name(dev.arch)},
                          {"date", now_utc_iso()},
                          {"command", cmd.str()},
                          {"read_bandwidth_bytes_per_s", kReadBandwidth},
                          {"timing", "CUDA-graph replay, median of 7, weights rotated out of L2; ours_us "
                                     "without PDL (as the tuner), ours_pdl_us with PDL; *_step_us: "
                                     "time added after a stand-in expert kernel that streams 16 MB, "
                                     "triggers its dependents at once and writes x (ours with PDL)"},
                          {"mismatches", mismatches},
                          {"records", records}};
    std::printf("%s\n", doc.dump(1).c_str());
  }
  return mismatches == 0 ? 0 : 2;
}

}  // namespace

void add_bench_router_gemm_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("router-gemm", "Router GEMM: the tuned dispatch vs cuBLAS");
  auto o = std::make_shared<RouterBenchOptions>();
  cmd->add_option("--model,-m", o->model, "Short name or path to config.json")->required();
  cmd->add_option("--batch,-b", o->batches, "Token counts M: '1-128', '1,2,4', '1-16,32'")
      ->capture_default_str();
  cmd->add_option("--tuning-file", o->tuning_file,
                  "Router GEMM table (JSON from `moekit tune`); default $MOEKIT_TUNING_FILE");
  cmd->add_option("--seed", o->seed, "Seed of the random weights and inputs")->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one JSON document instead of the table");
  cmd->callback([o] {
    const int status = run_bench_router_gemm(*o);
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace moekit::cli
