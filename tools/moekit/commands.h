// The moekit CLI's subcommands. Each file tools/moekit/cmd_*.cpp / bench_*.cpp adds one
// subcommand (or one backend of `bench`) to the CLI11 app; main.cpp only wires them together
// and turns moekit::Error into an exit status.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/layer.h"

namespace moekit::cli {

// Options of `moekit bench` (one MoE layer and a decode step over every MoE layer).
struct BenchOptions {
  std::string model;
  std::string weights;            // checkpoint dir, empty = random weights from seed
  std::vector<int> batches{1, 32, 128};
  std::string device = "auto";    // auto | cpu | cuda
  std::string backend = "fast";   // cpu only: fast | reference
  FuseShared fuse = FuseShared::Auto;
  uint64_t seed = 0;
  bool json = false;
  std::string plot;               // PNG path for the batch sweep, empty = none
  int threads = 0;                // cpu only: 0 = all cores
  int iterations = 0;             // 0 = chosen by the backend
  bool trace = false;             // cuda only: print each batch's kernel timeline
  int weight_sets = 0;            // cuda only: random layers to rotate among, 0 = all that fit
  std::string dtype = "config";   // the experts' dtype: bf16 | fp8 | config (as declared); cpu
                                  // also mxfp4 | mxfp8
};

// `moekit bench --ep N` (bench_ep.cpp): ranks, transport (nccl | local), modes (both |
// throughput | low-latency).
struct EpCliOptions {
  int world = 1;
  std::string transport = "nccl";
  std::string mode = "both";
};

void add_inspect_command(CLI::App& app);   // cmd_inspect.cpp
void add_run_command(CLI::App& app);       // cmd_run.cpp
CLI::App* add_bench_command(CLI::App& app);  // cmd_bench.cpp: returns `bench` for sub-benches
void add_tune_command(CLI::App& app);      // cmd_tune.cpp (router GEMM tuner)
void add_plan_commands(CLI::App& app);     // cmd_plan.cpp: `plan` and `list-kernels`
void add_bench_router_gemm_command(CLI::App& bench);  // bench_router_gemm.cpp
void add_bench_stream_command(CLI::App& bench);       // bench_stream.cpp
void add_bench_grouped_gemm_command(CLI::App& bench);  // bench_grouped_gemm.cpp

int run_bench_cpu(const BenchOptions& opt);   // bench_cpu.cpp
int run_bench_cuda(const BenchOptions& opt);  // bench_cuda.cpp
int run_bench_ep(const BenchOptions& opt, const EpCliOptions& ep);  // bench_ep.cpp

}  // namespace moekit::cli
