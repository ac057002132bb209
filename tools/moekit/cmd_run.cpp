// `moekit run --model M`: one MoE layer forward on random or checkpoint weights, on random x or x
// from --input; prints an output summary and the experts picked, and with --output writes the
// outputs to a safetensors file (run_io.cpp). For models with a shared expert it also runs the
// other fusion mode and prints the max relative difference between fused and unfused outputs.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "cli_context.h"
#include "commands.h"
#include "forward_backends.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"
#include "run_io.h"

namespace moekit::cli {
namespace {

struct RunOptions {
  std::string model;
  std::string weights;
  std::string input;   // x [T, H] (safetensors); T replaces --tokens
  std::string output;  // y, topk ids / weights, router logits (safetensors)
  int tokens = 4;
  int layer = -1;
  std::string fuse = "auto";
  std::string device = "auto";
  std::string backend = "fast";
  // bf16 | fp8 | mxfp4 | mxfp8: keep a quantised checkpoint's experts in its own format
  std::string expert_dtype = "bf16";
  std::string fp8_compute;            // w8a8 | weight-only; empty: the backend's (reference
                                      // w8a8, fast weight-only)
  uint64_t seed = 0;
  bool json = false;
  const CLI::App* cmd = nullptr;  // which options were given
};

struct Summary {
  double mean_abs = 0, max_abs = 0, sum = 0;
};

Summary summarize(const std::vector<float>& y) {
  Summary s;
  for (float v : y) {
    s.mean_abs += std::fabs(v);
    s.max_abs = std::max(s.max_abs, static_cast<double>(std::fabs(v)));
    s.sum += v;
  }
  if (!y.empty()) s.mean_abs /= static_cast<double>(y.size());
  return s;
}

void run(const RunOptions& options) {
  RunOptions o = options;
  MK_CHECK(o.tokens >= 1, "--tokens must be >= 1, got " << o.tokens);
  const MoeSpec spec = load_spec(o.model);
  std::vector<Bf16> input_x;
  if (!o.input.empty()) input_x = read_run_input(o.input, spec, o.tokens);
  const int layer = pick_moe_layer(spec, o.layer);
  const FuseShared fuse = fuse_shared_from_env(parse_fuse_shared(o.fuse));
  const std::string device = resolve_device(o.device);
  if (device == "cuda") refuse_unused_option(*o.cmd, "--backend", device, "--device cpu");
  const ExpertFormat held = [&] {
    try {
      return parse_expert_format(o.expert_dtype);
    } catch (const Error&) {
      MK_FAIL("--expert-dtype '" << o.expert_dtype << "' is not one of bf16, fp8, mxfp4, mxfp8");
    }
  }();
  const bool keep_fp8 = held == ExpertFormat::Fp8Block;
  const Fp8Compute fp8_compute = parse_fp8_compute(
      !o.fp8_compute.empty()                   ? o.fp8_compute
      : o.backend == "fast" && device == "cpu" ? "weight-only"
                                               : "w8a8");
  MK_CHECK(!keep_fp8 || device == "cpu" || fp8_compute == Fp8Compute::W8A8,
           "the GPU layer computes fp8 experts W8A8, not " << fp8_compute_name(fp8_compute));
  MK_CHECK(!(fuse == FuseShared::On && !spec.can_fuse_shared()),
           "--fuse-shared on: '" << spec.name << "' has "
                                 << (spec.shared_kind == SharedKind::None
                                         ? std::string("no shared expert")
                                         : "a shared width " +
                                               std::to_string(spec.shared_intermediate) +
                                               " that is not a multiple of the expert width " +
                                               std::to_string(spec.expert_intermediate)));
  // Host memory, before anything is allocated: the input, two outputs (both fusion modes), and on
  // the CPU the weights and activations of both modes.
  HostMemoryEstimate need = host_memory_estimate(spec, o.tokens, spec.can_fuse_shared());
  need.workspace = spec.can_fuse_shared() ? static_cast<size_t>(o.tokens) * spec.hidden * 4 : 0;
  if (device == "cuda" && o.weights.empty()) need.weights = need.activations = 0;
  check_host_memory(need, spec.name + " (" + std::to_string(o.tokens) + " tokens)");
  const std::vector<Bf16> x = o.input.empty() ? random_input(spec, o.tokens, o.seed) : input_x;
  // Random weights on the GPU are generated there (bit-identical to the host generator), so a
  // 22.6 GB DeepSeek-V3 layer never passes through host memory.
  // Without --weights the experts are random in that form: on the CPU the random bf16 weights
  // quantised as save_checkpoint writes the form (make_random_weights), on the GPU fp8 or MX
  // codes and scales generated there.
  std::unique_ptr<LayerWeights> weights;
  std::unique_ptr<cuda::GpuMoeLayer> gpu_layer;
  std::string origin;
  if (device == "cuda" && o.weights.empty() && o.output.empty()) {
    cuda::GpuLayerOptions opt;
    opt.max_tokens = o.tokens;
    opt.overrides = env_overrides();
    opt.expert_dtype = gpu_expert_dtype(held);
    opt.mx_format = gpu_mx_format(held);
    gpu_layer = cuda::GpuMoeLayer::create_random(spec, layer, o.seed, opt);
    origin = "random seed " + std::to_string(o.seed) + " (generated on the GPU)";
  } else {
    weights = load_layer_weights(spec, layer, o.weights, o.seed, held);
    origin = weights->origin();
  }
  auto forward = [&](FuseShared mode) {
    if (gpu_layer) return gpu_layer->forward(x.data(), o.tokens, mode);
    return forward_on(device, o.backend, *weights, x.data(), o.tokens, mode, fp8_compute);
  };

  const ForwardResult r = forward(fuse);
  check_finite_output(r.y, spec.hidden, std::string("the forward (shared expert ") +
                                            (r.fused ? "fused)" : "unfused)"));
  if (!o.output.empty())
    write_run_output(o.output, spec, r, cpu_reference::router_logits(*weights, x.data(), o.tokens),
                     {{"model", spec.name},
                      {"layer", std::to_string(layer)},
                      {"device", device == "cpu" ? "cpu (" + o.backend + ")" : device},
                      {"fuse_shared", r.fused ? "on" : "off"},
                      {"weights", origin}});
  // The other fusion mode, on the same backend, for the fused-vs-unfused agreement check.
  double fused_vs_unfused = -1.0;
  // (fp8 and MX on the GPU: the shared expert runs fused only)
  if (spec.can_fuse_shared() && !(held != ExpertFormat::Bf16 && device == "cuda")) {
    const ForwardResult other = forward(r.fused ? FuseShared::Off : FuseShared::On);
    check_finite_output(other.y, spec.hidden, std::string("the forward (shared expert ") +
                                                  (other.fused ? "fused)" : "unfused)"));
    fused_vs_unfused = r.fused ? max_relative_difference(r.y, other.y)
                               : max_relative_difference(other.y, r.y);
  }
  const Summary sum = summarize(r.y);

  if (o.json) {
    nlohmann::json j = {{"model", spec.name},
                        {"layer", layer},
                        {"tokens", o.tokens},
                        {"device", device},
                        {"backend", device == "cpu" ? o.backend : device},
                        {"fuse_shared", r.fused ? "on" : "off"},
                        {"weights", origin},
                        {"expert_dtype", held == ExpertFormat::Fp8Block ? "F8_E4M3"
                                         : held == ExpertFormat::Bf16   ? "BF16"
                                                                        : expert_format_name(held)},
                        {"y_mean_abs", sum.mean_abs},
                        {"y_max_abs", sum.max_abs},
                        {"y_sum", sum.sum},
                        {"slots_per_token", r.routing.slots}};
    nlohmann::json experts = nlohmann::json::array(), wts = nlohmann::json::array();
    for (int t = 0; t < r.routing.tokens; ++t) {
      nlohmann::json ids = nlohmann::json::array(), ws = nlohmann::json::array();
      for (int s = 0; s < r.routing.slots; ++s) {
        ids.push_back(r.routing.ids[t * r.routing.slots + s]);
        ws.push_back(r.routing.weights[t * r.routing.slots + s]);
      }
      experts.push_back(ids);
      wts.push_back(ws);
    }
    j["experts"] = experts;
    j["weights_per_slot"] = wts;
    if (fused_vs_unfused >= 0) j["fused_vs_unfused_max_rel_diff"] = fused_vs_unfused;
    if (held == ExpertFormat::Fp8Block) j["fp8_compute"] = fp8_compute_name(fp8_compute);
    if (held == ExpertFormat::Mxfp4 || held == ExpertFormat::Mxfp8)
      j["mx_compute"] = held == ExpertFormat::Mxfp4 ? "w4a16" : "w8a16";
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::printf("model %s, MoE layer %d, %d token(s), device %s%s, shared expert %s\n",
              spec.name.c_str(), layer, o.tokens, device.c_str(),
              device == "cpu" ? (" (" + o.backend + ")").c_str() : "",
              spec.shared_kind == SharedKind::None ? "none"
                                                   : (r.fused ? "fused" : "unfused"));
  std::printf("weights: %s\n", origin.c_str());
  if (held == ExpertFormat::Fp8Block)
    std::printf("experts: fp8, computed %s\n", fp8_compute_name(fp8_compute));
  if (held == ExpertFormat::Mxfp4 || held == ExpertFormat::Mxfp8)
    std::printf("experts: %s, computed %s (weights dequantised exactly, bf16 activations)\n",
                expert_format_name(held), held == ExpertFormat::Mxfp4 ? "W4A16" : "W8A16");
  std::printf("output y [%d, %d]: mean |y| %.6g, max |y| %.6g, sum %.6g\n", o.tokens, spec.hidden,
              sum.mean_abs, sum.max_abs, sum.sum);
  const int shown = std::min(o.tokens, 8);
  for (int t = 0; t < shown; ++t) {
    std::printf("token %d experts:", t);
    for (int s = 0; s < r.routing.slots; ++s) {
      const int id = r.routing.ids[t * r.routing.slots + s];
      std::printf(" %d%s(%.4f)", id, id >= spec.num_experts ? "[shared]" : "",
                  r.routing.weights[t * r.routing.slots + s]);
    }
    std::printf("\n");
  }
  if (o.tokens > shown) std::printf("... %d more token(s)\n", o.tokens - shown);
  if (fused_vs_unfused >= 0)
    std::printf("fused vs unfused: max relative difference %.3g\n", fused_vs_unfused);
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Run one MoE layer forward and print what it picked");
  auto o = std::make_shared<RunOptions>();
  cmd->add_option("--model,-m", o->model, "Short name (e.g. deepseek-v3) or path to config.json")
      ->required();
  cmd->add_option("--weights", o->weights, "Checkpoint directory (*.safetensors); default random");
  cmd->add_option("--tokens,-t", o->tokens, "Number of tokens")
      ->capture_default_str()
      ->check(decimal_integer(false));
  cmd->add_option("--input", o->input,
                  "x [tokens, hidden] from a safetensors file (tensor 'x', BF16 or F32); "
                  "default random. Its token count replaces --tokens");
  cmd->add_option("--output", o->output,
                  "Write y, topk_ids, topk_weights and router_logits to a safetensors file");
  cmd->add_option("--layer", o->layer, "MoE layer index (default: the first MoE layer)")
      ->check(decimal_integer(true));
  cmd->add_option("--fuse-shared", o->fuse, "Shared expert as fused slots: auto|on|off")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "auto|cpu|cuda (auto: cuda when a GPU is usable)")
      ->capture_default_str();
  cmd->add_option("--backend", o->backend, "CPU backend: fast|reference")->capture_default_str();
  cmd->add_option("--expert-dtype", o->expert_dtype,
                  "bf16 (checkpoints dequantised at load), or fp8 / mxfp4 / mxfp8: the experts "
                  "held in that form (a checkpoint's as stored, random ones quantised)")
      ->capture_default_str();
  cmd->add_option("--fp8-compute", o->fp8_compute,
                  "fp8 experts: w8a8 or weight-only (default: w8a8 on the reference, "
                  "weight-only on the fast backend)");
  cmd->add_option("--seed", o->seed, "Seed of random weights and inputs")
      ->capture_default_str()
      ->check(decimal_integer(true));
  cmd->add_flag("--json", o->json, "Print JSON");
  o->cmd = cmd;
  cmd->callback([o] { run(*o); });
}

}  // namespace moekit::cli
