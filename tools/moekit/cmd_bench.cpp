// `moekit bench --model M [--batch 1,32,128] [--device cpu|cuda] [--fuse-shared ...] [--json]`:
// per-layer time and tokens/s; the CPU and CUDA backends each measure their own bandwidth ceiling
// in the same run (bench_cpu.cpp, bench_cuda.cpp). `bench router-gemm` is a sub-benchmark; `--ep N`
// the expert-parallel layer over N ranks (bench_ep.cpp).
#include "cli_common.h"
#include "commands.h"
#include "forward_backends.h"
#include "moekit/ep_nccl.h"
#include "moekit/error.h"
#include "token_list.h"

namespace moekit::cli {

CLI::App* add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Time one MoE layer and a decode step (or a sub-bench)");
  auto o = std::make_shared<BenchOptions>();
  auto batches = std::make_shared<std::string>("1,32,128");
  auto fuse = std::make_shared<std::string>("auto");
  cmd->add_option("--model,-m", o->model, "Short name or path to config.json");
  cmd->add_option("--weights", o->weights, "Checkpoint directory; default random weights");
  cmd->add_option("--batch,-b", *batches, "Token counts: '1,32,128', '1-16,32'")->capture_default_str();
  cmd->add_option("--device", o->device, "auto|cpu|cuda")->capture_default_str();
  cmd->add_option("--backend", o->backend, "CPU backend: fast|reference")->capture_default_str();
  cmd->add_option("--fuse-shared", *fuse, "auto|on|off")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of random weights and inputs")
      ->capture_default_str()
      ->check(decimal_integer(true));
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores)")
      ->capture_default_str()
      ->check(decimal_integer(true));
  cmd->add_option("--iterations", o->iterations, "Timed iterations (0 = automatic)")
      ->check(decimal_integer(true));
  cmd->add_option("--weight-sets", o->weight_sets,
                  "Distinct random layers the GPU bench rotates among (cuda; 0 = as many as "
                  "fit; 1 keeps a profiler's kernel replay from saving them all)")
      ->check(decimal_integer(true));
  cmd->add_option("--plot", o->plot, "Draw the batch sweep to this PNG (cuda)");
  cmd->add_flag("--json", o->json, "Print JSON records");
  cmd->add_flag("--trace", o->trace,
                "Print each batch's kernel timeline to stderr (cuda, up to 512 tokens)");
  cmd->add_option("--dtype", o->dtype,
                  "Experts' dtype: bf16|fp8|mxfp4|mxfp8|config (what the config declares)")
      ->capture_default_str();
  auto ep = std::make_shared<EpCliOptions>();
  cmd->add_option("--ep", ep->world, "Expert-parallel ranks; 1 = one GPU holds every expert")
      ->capture_default_str()
      ->check(decimal_integer(true));
  cmd->add_option("--ep-transport", ep->transport,
                  "With --ep: nccl (one GPU per rank) | local (every rank on one GPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"nccl", "local"}));
  cmd->add_option("--ep-mode", ep->mode, "With --ep: both | throughput | low-latency")
      ->capture_default_str()
      ->check(CLI::IsMember({"both", "throughput", "low-latency"}));
  cmd->require_subcommand(0, 1);
  cmd->callback([cmd, o, batches, fuse, ep] {
    if (!cmd->get_subcommands().empty()) return;  // a sub-benchmark ran instead
    MK_CHECK(ep->world >= 1, "bench: expected --ep >= 1, got " << ep->world);
    const bool ep_bench =
        ep->world > 1 || cmd->count("--ep-transport") > 0 || cmd->count("--ep-mode") > 0;
    if (ep->world > 1 && ep->transport == "nccl") {
      const ep::NcclSupport& nccl = ep::nccl_support();
      MK_CHECK(nccl.on(), "bench --ep " << ep->world << ": " << nccl.describe());
    }
    if (ep_bench) {
      MK_CHECK(!o->model.empty(), "bench: --model is required");
      for (const char* unused : {"--weights", "--plot", "--trace", "--threads", "--backend",
                                 "--weight-sets", "--dtype", "--fuse-shared"}) {
        MK_CHECK(cmd->count(unused) == 0,
                 "bench --ep: " << unused
                                << " belongs to the one-GPU bench (the expert-parallel "
                                   "bench runs random bf16 weights, the shared expert "
                                   "fused)");
      }
      o->batches = parse_token_list(*batches, "--batch");
      MK_CHECK(resolve_device(o->device) == "cuda", "bench --ep runs on GPUs; --device "
                                                        << o->device << " gives the CPU here ("
                                                        << ep::nccl_support().describe() << ")");
      const int status = run_bench_ep(*o, *ep);
      if (status != 0) throw CLI::RuntimeError(status);
      return;
    }
    MK_CHECK(!o->model.empty(), "bench: --model is required");
    o->batches = parse_token_list(*batches, "--batch");
    o->fuse = fuse_shared_from_env(parse_fuse_shared(*fuse));
    const std::string device = resolve_device(o->device);
    MK_CHECK(!o->trace || device == "cuda",
             "bench: --trace records GPU kernels; use --device cuda");
    if (device == "cuda") {
      refuse_unused_option(*cmd, "--threads", device, "--device cpu");
      refuse_unused_option(*cmd, "--backend", device, "--device cpu");
    } else {
      refuse_unused_option(*cmd, "--plot", device, "--device cuda");
      refuse_unused_option(*cmd, "--weight-sets", device, "--device cuda");
    }
    const int status = device == "cuda" ? run_bench_cuda(*o) : run_bench_cpu(*o);
    if (status != 0) throw CLI::RuntimeError(status);
  });
  return cmd;
}

}  // namespace moekit::cli
