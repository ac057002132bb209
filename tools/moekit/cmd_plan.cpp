// `moekit plan --model M --batch 1,32,4096 [--fuse-shared auto|on|off]
// [--device-info sm90|h100|sm100|live] [--dtype bf16|fp8|mxfp4|mxfp8|config] [--json]`: which
// kernels a GPU forward runs at each batch and why (moekit/plan.h), without a GPU unless
// --device-info live; the environment's plan knobs apply as they do for `bench`.
// `moekit list-kernels`: every compiled expert-kernel instance of the plan's tables (the decode
// kernels', then the prefill path's grouped GEMMs).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_common.h"
#include "cli_context.h"
#include "commands.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"
#include "moekit/plan.h"
#include "moekit/spec.h"
#include "token_list.h"

namespace moekit::cli {
namespace {

struct PlanOptions {
  std::string model;
  std::string batches = "1,32,128";
  std::string fuse = "auto";
  std::string device_info = "sm90";
  std::string dtype = "bf16";
  bool json = false;
};

plan::DeviceInfo device_info(const std::string& name) {
  if (name != "live") return plan::device_profile(name);
  std::string why;
  MK_CHECK(cuda::available(&why), "--device-info live: no usable GPU: " << why);
  return cuda::live_device_info(0);
}

int run_plan(const PlanOptions& o) {
  const MoeSpec spec = load_spec(o.model);
  const plan::DeviceInfo dev = device_info(o.device_info);
  const FuseShared fuse = parse_fuse_shared(o.fuse);
  const ExpertFormat format = bench_format(spec, o.dtype, "plan");
  const DType experts = gpu_expert_dtype(format);
  const ExpertFormat mx = gpu_mx_format(format);
  nlohmann::json plans = nlohmann::json::array();
  for (const int t : parse_token_list(o.batches, "--batch")) {
    const plan::LayerPlan p = plan::plan_layer(spec, t, fuse, env_overrides(), dev, experts, mx);
    if (o.json) {
      plans.push_back(nlohmann::json::parse(plan::to_json(p)));
    } else {
      std::printf("%s", plan::describe(p).c_str());
    }
  }
  if (o.json) std::printf("%s\n", plans.dump(2).c_str());
  return 0;
}

}  // namespace

void add_plan_commands(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Print which kernels a GPU forward runs, and why");
  auto o = std::make_shared<PlanOptions>();
  cmd->add_option("--model,-m", o->model, "Short name or path to config.json")->required();
  cmd->add_option("--batch,-b", o->batches, "Token counts: '1,32,4096', '1-16'")
      ->capture_default_str();
  cmd->add_option("--fuse-shared", o->fuse, "auto|on|off")->capture_default_str();
  cmd->add_option("--device-info", o->device_info, "sm90|h100|sm100 (profiles) or live (the GPU)")
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype,
                  "Experts held in bf16|fp8|mxfp4|mxfp8|config (what the config declares)")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print the plans as JSON");
  cmd->callback([o] {
    const int status = run_plan(*o);
    if (status != 0) throw CLI::RuntimeError(status);
  });

  auto* list = app.add_subcommand("list-kernels", "List every compiled expert-kernel instance (decode kernels, grouped GEMMs)");
  auto as_json = std::make_shared<bool>(false);
  list->add_flag("--json", *as_json, "Print the instances as JSON");
  list->callback([as_json] {
    nlohmann::json arr = nlohmann::json::array();
    for (const plan::ExpertKernel& k : plan::expert_kernels()) {
      if (!*as_json) {
        std::printf("%s\n", plan::describe(k).c_str());
        continue;
      }
      arr.push_back({{"name", k.name},
                     {"gemm", plan::gemm_name(k.gemm)},
                     {"stream", plan::stream_name(k.stream)},
                     {"n_tiles", k.n_tiles},
                     {"ring", plan::ring_name(k.ring)},
                     {"split_rows", k.split_rows},
                     {"l2_keep", k.l2_keep},
                     {"down_tail", k.down_tail},
                     {"half_items", k.half_items},
                     {"self_route", k.self_route},
                     {"fp8", k.fp8},
                     {"unroll", k.unroll},
                     {"warps", k.warps},
                     {"ctas_per_sm", k.ctas_per_sm}});
    }
    // the prefill path's grouped GEMM instances (stream "grouped")
    for (const plan::GroupedGemmKernel& k : plan::grouped_gemm_kernels()) {
      if (!*as_json) {
        std::printf("%s\n", plan::describe(k).c_str());
        continue;
      }
      arr.push_back({{"name", k.name},
                     {"stream", plan::stream_name(plan::Stream::Grouped)},
                     {"fp8", k.fp8},
                     {"tile_m", k.tile_m},
                     {"tile_n", k.tile_n},
                     {"tile_k", k.tile_k},
                     {"schedule", plan::grouped_schedule_name(k.schedule)},
                     {"cluster_m", k.cluster_m},
                     {"cluster_n", k.cluster_n}});
    }
    if (*as_json) std::printf("%s\n", arr.dump(2).c_str());
  });
}

}  // namespace moekit::cli
