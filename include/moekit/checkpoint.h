// Checkpoint names: how each model family publishes one MoE layer's tensors, and writing a layer
// back out under those names (for tests, and for users who want a small real-format checkpoint).
// Loading is load_checkpoint_weights() in weights.h; it accepts every form listed here.
//
// Per family, inside the layer prefix (model.layers.{L}. / language_model.model.layers.{L}. /
// model.language_model.layers.{L}. / layers.{L}.):
//   HfMlp      DeepSeek-V2/V3/V3.2, Kimi-K2, GLM-4.5/5, Qwen3-MoE:
//              mlp.gate.weight [E,H], mlp.gate.e_score_correction_bias [E],
//              mlp.experts.{e}.{gate,up,down}_proj.weight,
//              mlp.shared_experts.{gate,up,down}_proj.weight
//   Qwen2Moe   as HfMlp, but the shared MLP is mlp.shared_expert.{gate,up,down}_proj.weight,
//              plus mlp.shared_expert_gate.weight [1,H]
//   Mixtral    block_sparse_moe.gate.weight,
//              block_sparse_moe.experts.{e}.{w1,w3,w2}.weight (w1 gate, w3 up, w2 down)
//   MiniMax    MiniMax-M2/M3: block_sparse_moe.gate.weight (fp32),
//              block_sparse_moe.e_score_correction_bias,
//              block_sparse_moe.experts.{e}.{w1,w3,w2}.weight,
//              block_sparse_moe.shared_experts.{gate,up,down}_proj.weight (M3, whose VL wrapper
//              prefixes language_model.)
//   DeepSeekV4 layers.{L}.ffn.gate.weight, ffn.gate.bias (the correction bias),
//              ffn.experts.{e}.{w1,w3,w2}.weight, ffn.shared_experts.{w1,w3,w2}.weight;
//              block scales in <base>.scale; routed experts may be packed FP4 (below)
//   GptOss     mlp.router.weight/bias, mlp.experts.gate_up_proj [E,H,2I] (gate = even columns,
//              up = odd), gate_up_proj_bias [E,2I], down_proj [E,I,H], down_proj_bias [E,H];
//              or the published MXFP4 form gate_up_proj_blocks [E,2I,H/32,16] + _scales
//              [E,2I,H/32], down_proj_blocks [E,H,I/32,16] + _scales [E,H,I/32] (U8)
// Every family but GptOss also loads from the transformers-5 stacked form:
//   <block>experts.gate_up_proj [E,2I,H] (gate rows, then up rows), <block>experts.down_proj
//   [E,H,I].
// Expert and shared weights may be BF16 (mapped, not copied, where the layout allows), F16 or F32
// (converted to bf16, round to nearest even), F8_E4M3 with a 128x128 block scale (<name>_scale_inv
// as DeepSeek-V3 publishes it, or <name minus .weight>.scale as DeepSeek-V4 does; F32, BF16, F16
// or F8_E8M0), or packed FP4 e2m1 (I8/U8 [N, K/2], low nibble = even column) with a 1x32 scale
// [N, K/32] (DeepSeek-V4's routed experts); dequantised to bf16 on first use of the expert. With
// an mxfp8 config (quantization_config.quant_method "mxfp8") every F8_E4M3 expert or shared weight
// takes a 1x32 e8m0 scale instead: U8 or F8_E8M0 [N, K/32] named <name>_scale_inv, <name>_scale
// or <base>.scale. LoadOptions::expert_format keeps fp8 and MX experts in their stored form
// (docs/decisions/fp8_experts.md, mx_experts.md).
#pragma once

#include <string>
#include <vector>

#include "moekit/dtype.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit {

enum class CheckpointNaming { Auto, HfMlp, Qwen2Moe, Mixtral, MiniMax, DeepSeekV4, GptOss };

const char* checkpoint_naming_name(CheckpointNaming n);  // "auto", "hf-mlp", "qwen2-moe", ...
CheckpointNaming parse_checkpoint_naming(const std::string& s);
// The naming a spec's model_type publishes under (never Auto).
CheckpointNaming checkpoint_naming_for(const MoeSpec& spec);

struct SaveCheckpointOptions {
  CheckpointNaming naming = CheckpointNaming::Auto;  // Auto: checkpoint_naming_for(spec)
  // transformers-5 stacked experts instead of per-expert tensors (GptOss is always stacked).
  bool stacked = false;
  // Expert and shared MLP dtype: BF16 (exact), F32 (exact), F16, or F8_E4M3 with 128x128 block
  // scales (amax / 448) in F32 <name>_scale_inv (DeepSeekV4 naming: <base>.scale).
  DType expert_dtype = DType::BF16;
  // Mxfp4 / Mxfp8 write the experts (and the shared MLP) in that OCP MX form instead, quantised
  // from the bf16 weights (io/mx_experts.h mx_quantize_row); expert_dtype must then be BF16.
  // Mxfp4: the gpt-oss naming only, as gpt-oss publishes it (gate_up_proj_blocks [E,2I,H/32,16]
  // with rows interleaved gate/up, _scales [E,2I,H/32] U8, down_proj_blocks / _scales).
  // Mxfp8: every other naming, each weight F8_E4M3 [N, K] with "<name>_scale" U8 [N, K/32]
  // (NVIDIA ModelOpt's weight_scale spelling). Bf16 / Fp8Block: per expert_dtype.
  ExpertFormat expert_format = ExpertFormat::Bf16;
  // Layer prefix; empty = the family's published one ("model.layers.{L}.", MiniMax-M3
  // "language_model.model.layers.{L}.", DeepSeek-V4 "layers.{L}."). "{L}" is replaced.
  std::string layer_prefix;
  // File name inside dir; empty = "model-layer-{L}.safetensors".
  std::string file_name;
};

// Writes layer w.layer() of w (materialising every expert) into dir (created if needed) and adds
// its tensors to dir/model.safetensors.index.json (created, or merged with the entries already
// there, so several layers can be saved into one directory). Returns the file written.
std::string save_checkpoint(const LayerWeights& w, const std::string& dir,
                            const SaveCheckpointOptions& options = {});
std::string save_checkpoint(const LayerWeights& w, const std::string& dir, CheckpointNaming naming);

// The names of one MoE layer's tensors under a naming, per-expert or stacked form, as save writes
// them (bf16; no scale tensors). For `moekit inspect` and for tests.
std::vector<std::string> checkpoint_tensor_names(const MoeSpec& spec, int layer,
                                                 CheckpointNaming naming, bool stacked = false);

}  // namespace moekit
