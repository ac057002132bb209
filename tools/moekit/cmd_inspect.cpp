// `moekit inspect --model M`: the spec, which layers are MoE, bytes per layer and per token, and
// the router GEMM shapes (K, N) the model needs.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "moekit/spec.h"

namespace moekit::cli {
namespace {

// "3-60" style ranges for the MoE layer list.
std::string layer_ranges(const std::vector<int>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(layers[i]);
    if (j > i) out += "-" + std::to_string(layers[j]);
    i = j + 1;
  }
  return out;
}

void inspect(const std::string& model, bool as_json) {
  const MoeSpec s = load_spec(model);
  const double expert_bytes = static_cast<double>(s.expert_bytes());
  const double layer_expert_bytes = expert_bytes * s.num_experts;
  // One token reads k routed experts, the shared MLP and the router weight.
  const double token_bytes = expert_bytes * s.top_k + s.shared_bytes() + s.router_bytes();
  nlohmann::json j = {
      {"model", s.name},
      {"model_type", s.model_type},
      {"config", s.source_path},
      {"hidden", s.hidden},
      {"experts", s.num_experts},
      {"top_k", s.top_k},
      {"expert_intermediate", s.expert_intermediate},
      {"shared", shared_kind_name(s.shared_kind)},
      {"shared_intermediate", s.shared_intermediate},
      {"shared_slots", s.shared_slots()},
      {"scoring", scoring_name(s.scoring)},
      {"correction_bias", s.has_correction_bias},
      {"n_group", s.n_group},
      {"topk_group", s.topk_group},
      {"renormalize", s.renormalize},
      {"routed_scaling_factor", s.routed_scaling_factor},
      {"router_dtype", dtype_name(s.router_dtype)},
      {"router_bias", s.has_router_bias},
      {"activation", activation_name(s.activation)},
      {"swiglu_limit", s.swiglu_limit},
      {"layers", s.num_layers},
      {"moe_layers", s.moe_layers.size()},
      {"moe_layer_indices", layer_ranges(s.moe_layers)},
      {"bytes_per_expert", s.expert_bytes()},
      {"bytes_experts_per_layer", layer_expert_bytes},
      {"bytes_shared_per_layer", s.shared_bytes()},
      {"bytes_router_per_layer", s.router_bytes()},
      {"bytes_touched_per_token_per_layer", token_bytes},
      {"router_gemm_shapes",
       nlohmann::json::array({{{"K", s.hidden},
                               {"N", s.router_columns()},
                               {"dtype", dtype_name(s.router_dtype)},
                               {"bias", s.has_router_bias},
                               {"layers", s.moe_layers.size()}}})},
  };
  if (s.num_hash_layers > 0) j["hash_routed_layers"] = s.num_hash_layers;
  // The checkpoint's own format: fp8 experts are read as e4m3 bytes + fp32 tile scales, MX
  // experts as packed elements + one e8m0 byte per 32 (--expert-dtype fp8 / mxfp4 / mxfp8).
  const bool fp8 = s.fp8_experts();
  const bool mx = s.mx_experts();
  const double stored_expert = static_cast<double>(
      fp8 ? s.fp8_expert_bytes() : mx ? s.mx_expert_bytes() : s.expert_bytes());
  const double stored_shared = static_cast<double>(
      fp8 ? s.fp8_shared_bytes() : mx ? s.mx_shared_bytes() : s.shared_bytes());
  const double stored_token = stored_expert * s.top_k + stored_shared + s.router_bytes();
  nlohmann::json q = {{"kind", quant_kind_name(s.quant.kind)}};
  if (fp8) {
    q["weight_block_size"] = {s.quant.block_out, s.quant.block_in};
    q["scale_fmt"] = s.quant.scale_ue8m0 ? "ue8m0" : "float32";
    q["activation_scheme"] = s.quant.activation_scheme;
  }
  if (mx) {
    q["weight_block_size"] = {s.quant.block_out, s.quant.block_in};
    q["element"] = s.quant.kind == QuantKind::Mxfp4 ? "e2m1" : "e4m3";
    q["scale"] = "e8m0";
    q["compute"] = s.quant.kind == QuantKind::Mxfp4 ? "w4a16" : "w8a16";
  }
  if (s.quant.kind != QuantKind::None) q["modules_to_not_convert"] = s.quant.modules_to_not_convert;
  j["quantization"] = q;
  j["stored_expert_dtype"] = fp8 ? "F8_E4M3" : mx ? quant_kind_name(s.quant.kind) : "BF16";
  j["stored_bytes_per_expert"] = stored_expert;
  j["stored_bytes_experts_per_layer"] = stored_expert * s.num_experts;
  j["stored_bytes_shared_per_layer"] = stored_shared;
  j["stored_bytes_touched_per_token_per_layer"] = stored_token;
  if (as_json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::printf("model            %s (%s)\n", s.name.c_str(), s.model_type.c_str());
  std::printf("config           %s\n", s.source_path.c_str());
  std::printf("hidden H         %d\n", s.hidden);
  std::printf("experts E / k    %d / %d, intermediate I = %d, activation %s", s.num_experts,
              s.top_k, s.expert_intermediate, activation_name(s.activation));
  if (s.swiglu_limit > 0) std::printf(" (clamp %g)", s.swiglu_limit);
  std::printf("\nshared expert    %s", shared_kind_name(s.shared_kind));
  if (s.shared_kind != SharedKind::None)
    std::printf(", width %d = %d fused slot(s)%s", s.shared_intermediate, s.shared_slots(),
                s.can_fuse_shared() ? "" : " (not a multiple of I: runs unfused)");
  std::printf("\nrouting          %s%s, groups %d keep %d%s, renormalize %s, scaling %g\n",
              scoring_name(s.scoring), s.has_correction_bias ? " + correction bias" : "",
              s.n_group, s.topk_group,
              s.n_group > 1 ? (s.group_score_top2_sum ? " (top-2 sum)" : " (max)") : "",
              s.renormalize ? "yes" : "no", s.routed_scaling_factor);
  std::printf("router           %s weights%s\n", dtype_name(s.router_dtype),
              s.has_router_bias ? " + bias" : "");
  std::printf("MoE layers       %zu of %d: %s\n", s.moe_layers.size(), s.num_layers,
              layer_ranges(s.moe_layers).c_str());
  if (s.num_hash_layers > 0)
    std::printf("                 (the first %d are hash-routed by token id in the model)\n",
                s.num_hash_layers);
  std::printf("bytes per layer  experts %s (%s each), shared %s, router %s\n",
              human_bytes(layer_expert_bytes).c_str(), human_bytes(expert_bytes).c_str(),
              human_bytes(static_cast<double>(s.shared_bytes())).c_str(),
              human_bytes(static_cast<double>(s.router_bytes())).c_str());
  std::printf("bytes per token  %s per layer touched at 1 token (bf16), %s per decode step\n",
              human_bytes(token_bytes).c_str(),
              human_bytes(token_bytes * static_cast<double>(s.moe_layers.size())).c_str());
  if (s.quant.kind == QuantKind::Fp8Block) {
    std::printf("quantisation     fp8 e4m3, %dx%d tiles, %s scales, %s activations\n",
                s.quant.block_out, s.quant.block_in, s.quant.scale_ue8m0 ? "ue8m0" : "fp32",
                s.quant.activation_scheme.c_str());
    std::printf("bytes in fp8     experts %s (%s each), shared %s per layer; %s per layer touched "
                "at 1 token, %s per decode step\n",
                human_bytes(stored_expert * s.num_experts).c_str(),
                human_bytes(stored_expert).c_str(), human_bytes(stored_shared).c_str(),
                human_bytes(stored_token).c_str(),
                human_bytes(stored_token * static_cast<double>(s.moe_layers.size())).c_str());
  } else if (mx) {
    const bool fp4 = s.quant.kind == QuantKind::Mxfp4;
    std::printf("quantisation     %s (%s experts, one e8m0 byte per 1x32), kept packed with "
                "--expert-dtype %s (%s, CPU)\n",
                quant_kind_name(s.quant.kind), fp4 ? "e2m1" : "e4m3",
                quant_kind_name(s.quant.kind), fp4 ? "W4A16" : "W8A16");
    std::printf("bytes packed     experts %s (%s each), shared %s per layer; %s per layer touched "
                "at 1 token, %s per decode step\n",
                human_bytes(stored_expert * s.num_experts).c_str(),
                human_bytes(stored_expert).c_str(), human_bytes(stored_shared).c_str(),
                human_bytes(stored_token).c_str(),
                human_bytes(stored_token * static_cast<double>(s.moe_layers.size())).c_str());
  }
  std::printf("router GEMM      (K, N) = (%d, %d) %s%s, once per MoE layer\n", s.hidden,
              s.router_columns(), dtype_name(s.router_dtype),
              s.has_router_bias ? " + bias" : "");
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Show a model's MoE spec, layers, bytes and shapes");
  auto model = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("--model,-m", *model, "Short name (e.g. deepseek-v3) or path to config.json")
      ->required();
  cmd->add_flag("--json", *json, "Print JSON");
  cmd->callback([model, json] { inspect(*model, *json); });
}

}  // namespace moekit::cli
