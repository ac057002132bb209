// `moekit bench grouped-gemm --model M [--batch 1024,4096] [--dtype bf16|fp8] [--fuse-shared
// on|off] [--kernels a,b] [--json]`: the prefill path's grouped GEMM instances alone
// (cuda_layer.h bench_grouped_gemms), each GEMM of the layer (gate/up, down) with the group sizes
// of a random routing: microseconds, TFLOP/s over the dtype's GEMM ceiling and the floor's
// fraction over the read bandwidth, both measured in the same run. Exit status 2 when an
// instance's output differs from the first one's by more than the accumulation order explains.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"
#include "moekit/plan.h"
#include "token_list.h"

namespace moekit::cli {
namespace {

// Instances of one dtype differ in their fp32 summation order only (and fp8 in where the block
// sums are promoted), so their bf16 outputs agree to a few bf16 ulps of the largest output.
constexpr double kMaxRelDiff = 2e-2;

struct GroupedGemmCliOptions {
  std::string model;
  std::string batches = "1024,4096";
  std::string dtype = "bf16";
  std::string fuse = "on";
  std::string kernels;
  uint64_t seed = 0;
  int reps = 10;
  bool json = false;
};

std::string command_text(const GroupedGemmCliOptions& o) {
  std::ostringstream cmd;
  cmd << "moekit bench grouped-gemm --model " << o.model << " --batch " << o.batches << " --dtype "
      << o.dtype << " --fuse-shared " << o.fuse << " --reps " << o.reps << " --seed " << o.seed;
  if (!o.kernels.empty()) cmd << " --kernels " << o.kernels;
  return cmd.str() + " --json";
}

int run_bench_grouped_gemm(const GroupedGemmCliOptions& o) {
  cuda::GroupedGemmBenchOptions opt;
  opt.spec = load_spec(o.model);
  opt.batches = parse_token_list(o.batches, "--batch");
  opt.fp8 = o.dtype == "fp8";
  opt.fuse_shared = o.fuse == "on";
  opt.seed = o.seed;
  opt.reps = o.reps;
  for (size_t begin = 0; begin < o.kernels.size();) {
    size_t end = o.kernels.find(',', begin);
    if (end == std::string::npos) end = o.kernels.size();
    const std::string name = o.kernels.substr(begin, end - begin);
    const int row = plan::find_grouped_gemm(name);
    MK_CHECK(row >= 0, "bench grouped-gemm: --kernels names '"
                           << name << "', not an instance (moekit list-kernels lists them)");
    opt.kernels.push_back(row);
    begin = end + 1;
  }
  for (const int row : opt.kernels) {
    MK_CHECK(plan::grouped_gemm_kernels()[row].fp8 == opt.fp8,
             "bench grouped-gemm: --kernels names " << plan::grouped_gemm_kernels()[row].name
                                                    << ", not a " << o.dtype << " instance");
  }
  std::string why;
  MK_CHECK(cuda::available(&why), "bench grouped-gemm: no usable GPU: " << why);
  const cuda::GroupedGemmBenchRun run = cuda::bench_grouped_gemms(opt);
  int mismatches = 0;
  for (const auto& r : run.records) {
    if (!(r.max_rel_diff <= kMaxRelDiff)) {
      std::fprintf(stderr,
                   "moekit bench grouped-gemm: %s %s at %d tokens differs from the "
                   "first instance by %g of the largest output\n",
                   r.kernel.c_str(), r.gemm.c_str(), r.batch, r.max_rel_diff);
      ++mismatches;
    }
  }
  if (!o.json) {
    std::printf("grouped GEMMs of %s, %s, on %s: read %.0f GB/s, %s ceiling %.0f TFLOP/s\n",
                opt.spec.name.c_str(), o.dtype.c_str(), run.device.c_str(), run.read_gbs,
                o.dtype.c_str(), run.peak_tflops);
    std::printf("%6s %-8s %-36s %7s %9s %7s %6s %6s %8s\n", "tokens", "gemm", "instance", "pad",
                "us", "TFLOP/s", "peak", "bw", "rel_diff");
    for (const auto& r : run.records) {
      std::printf("%6d %-8s %-36s %7.3f %9.1f %7.0f %6.3f %6.3f %8.1e\n", r.batch, r.gemm.c_str(),
                  r.kernel.c_str(), r.padded_rows / r.m, r.us, r.tflops, r.peak_fraction,
                  r.bw_fraction, r.max_rel_diff);
    }
    return mismatches == 0 ? 0 : 2;
  }
  nlohmann::json records = nlohmann::json::array();
  for (const auto& r : run.records) {
    records.push_back({{"model", opt.spec.name},
                       {"dtype", o.dtype},
                       {"batch", r.batch},
                       {"gemm", r.gemm},
                       {"kernel", r.kernel},
                       {"groups", r.groups},
                       {"m", r.m},
                       {"n", r.n},
                       {"k", r.k},
                       {"padded_rows", r.padded_rows},
                       {"us", r.us},
                       {"tflops", r.tflops},
                       {"peak_fraction", r.peak_fraction},
                       {"bytes", r.bytes},
                       {"floor_us", r.floor_us},
                       {"bw_fraction", r.bw_fraction},
                       {"max_rel_diff", r.max_rel_diff}});
  }
  nlohmann::json doc = {{"bench", "grouped-gemm"},
                        {"device", run.device},
                        {"date", now_utc_iso()},
                        {"command", command_text(o)},
                        {"timing",
                         "CUDA-graph replay of one launch, median; weights of every "
                         "group distinct memory (not L2-resident)"},
                        {"read_gbs", run.read_gbs},
                        {"peak_tflops", run.peak_tflops},
                        {"mismatches", mismatches},
                        {"records", records}};
  std::printf("%s\n", doc.dump(1).c_str());
  return mismatches == 0 ? 0 : 2;
}

}  // namespace

void add_bench_grouped_gemm_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand(
      "grouped-gemm", "The prefill path's grouped GEMM instances alone, per GEMM of the layer");
  auto o = std::make_shared<GroupedGemmCliOptions>();
  cmd->add_option("--model,-m", o->model, "Short name or path to config.json")->required();
  cmd->add_option("--batch,-b", o->batches, "Token counts: '1024,4096', '512-2048'")
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "Operands: bf16 | fp8 (block-scale W8A8)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "fp8"}));
  cmd->add_option("--fuse-shared", o->fuse, "The shared expert as more groups: on | off")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--kernels", o->kernels,
                  "Instances to time, comma-separated; default every "
                  "one of the dtype");
  cmd->add_option("--reps", o->reps, "Timed replays per instance (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--seed", o->seed, "Seed of the routing and the operands")
      ->capture_default_str()
      ->check(decimal_integer(true));
  cmd->add_flag("--json", o->json, "Print one JSON document instead of the table");
  cmd->callback([o] {
    const int status = run_bench_grouped_gemm(*o);
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace moekit::cli
