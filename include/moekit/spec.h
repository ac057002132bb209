// MoeSpec: everything moekit needs to know about one model's MoE block, read from the model's
// published config.json (src/spec/). Every family of DESIGN.md §5 maps onto this one struct; the
// checkpoint names live in weights (src/io/checkpoint_names.cpp), not here.
#pragma once

#include <string>
#include <vector>

#include "moekit/dtype.h"

namespace moekit {

// How router logits become selection keys and weights (DESIGN.md §1).
enum class Scoring {
  Softmax,        // Mixtral, Qwen2/3-MoE, DeepSeek-V2: softmax over all experts
  Sigmoid,        // DeepSeek-V3/V3.2, Kimi-K2, GLM-4.5/5, MiniMax-M2/M3 (with correction bias)
  SqrtSoftplus,   // DeepSeek-V4: sqrt(softplus(logit)) (with correction bias)
  SoftmaxOfTopk,  // gpt-oss: top-k on logits (+ router bias), softmax over the k picked
};
const char* scoring_name(Scoring s);

// The gated expert nonlinearity.
enum class Activation {
  Silu,            // silu(gate) * up; with swiglu_limit > 0 (DeepSeek-V4) gate <= limit, |up| <= limit
  SwigluOaiInterleaved,  // gpt-oss: gate/up interleaved in the checkpoint; clamped, g*sigmoid(alpha g)*(up+beta)
  SwigluOai,       // MiniMax-M3 swigluoai: as above, gate rows then up rows (split layout)
};
const char* activation_name(Activation a);

enum class SharedKind {
  None,
  Plain,  // added with weight 1 (DeepSeek family, GLM, MiniMax-M3, Kimi)
  Gated,  // multiplied per token by sigmoid(x . w_shared_gate) (Qwen2-MoE)
};
const char* shared_kind_name(SharedKind k);  // "none", "plain", "gated"

// The checkpoint's weight quantisation: config.json's quantization_config, read as transformers'
// AutoQuantizationConfig reads it (src/spec/quant_config.cpp).
enum class QuantKind {
  None,      // no quantization_config: the weights are float (bf16/f16/f32)
  Fp8Block,  // quant_method "fp8": e4m3 weights, one fp32 multiplier per 128x128 tile
  Mxfp4,     // quant_method "mxfp4" (gpt-oss): e2m1 experts, an e8m0 scale per 32 columns
  Mxfp8,     // quant_method "mxfp8" (MiniMax-M3 style): e4m3 weights, an e8m0 scale per 1x32
};
const char* quant_kind_name(QuantKind k);  // "none", "fp8-block", "mxfp4", "mxfp8"

struct QuantSpec {
  QuantKind kind = QuantKind::None;
  // Fp8Block: weight_block_size [out, in]; moekit supports [128, 128], what every fp8 model ships.
  // Mxfp4 / Mxfp8: [1, 32], the OCP MX block (one e8m0 exponent byte per 32 input elements).
  int block_out = 0;
  int block_in = 0;
  // scale_fmt "ue8m0" (DeepSeek-V3.1+/V4): every weight scale is a power of two (the loader
  // checks it) and W8A8 rounds each activation scale up to a power of two, as DeepSeek does.
  bool scale_ue8m0 = false;
  std::string activation_scheme;  // "dynamic": activations quantised per token at run time
  std::vector<std::string> modules_to_not_convert;  // kept in their float dtype (router, biases)
};

struct MoeSpec {
  // identity
  std::string name;        // short name ("deepseek-v3") or the path it was read from
  std::string model_type;  // config's model_type ("deepseek_v3", "qwen3_moe", ...)
  std::string source_path; // the config.json that was parsed

  // shapes
  int hidden = 0;              // H
  int num_experts = 0;         // E (routed)
  int top_k = 0;               // k
  int expert_intermediate = 0; // I
  int num_layers = 0;          // all decoder layers
  std::vector<int> moe_layers; // indices of the layers that hold an MoE block, ascending

  // routing
  Scoring scoring = Scoring::Softmax;
  bool has_correction_bias = false;  // e_score_correction_bias used for selection only
  int n_group = 1;                   // expert groups (1 = no grouping)
  int topk_group = 1;                // groups kept
  bool renormalize = false;          // norm_topk_prob (Mixtral always true)
  float routed_scaling_factor = 1.0f;
  // Group score: sum of the top-2 keys per group (with a correction bias) or the group max.
  bool group_score_top2_sum = false;
  DType router_dtype = DType::BF16;  // Wg dtype (fp32 for MiniMax-M2/M3, DeepSeek-V4)
  bool has_router_bias = false;      // gpt-oss

  // experts
  Activation activation = Activation::Silu;
  float swiglu_limit = 0.0f;   // 0 = no clamp
  float swiglu_alpha = 1.702f; // swigluoai only
  float swiglu_beta = 1.0f;    // swigluoai only: (up + beta)
  bool has_expert_bias = false;  // gpt-oss: gate_up and down biases

  // shared expert
  SharedKind shared_kind = SharedKind::None;
  int shared_intermediate = 0;  // width of the shared MLP (n_shared_experts * I, or Qwen2's size)

  // DeepSeek-V4 routes its first num_hash_layers MoE layers by token id, not by score; moekit
  // runs the scored layers (hash routing needs the token ids, which an MoE block does not see).
  int num_hash_layers = 0;

  // How the checkpoint stores its weights (the router is never quantised by moekit).
  QuantSpec quant;
  bool fp8_experts() const { return quant.kind == QuantKind::Fp8Block; }
  bool mx_experts() const { return quant.kind == QuantKind::Mxfp4 || quant.kind == QuantKind::Mxfp8; }

  // Shared slots after fusion: shared_intermediate / I when it divides evenly, else 0.
  int shared_slots() const;
  bool can_fuse_shared() const { return shared_slots() > 0; }
  // Rows of the stacked expert weights when fused (E + S) or unfused (E).
  int weight_rows(bool fused) const { return num_experts + (fused ? shared_slots() : 0); }
  // Router GEMM output columns: E, plus one for a gated shared expert's gate logit.
  int router_columns() const { return num_experts + (shared_kind == SharedKind::Gated ? 1 : 0); }
  bool is_moe_layer(int layer) const;

  // Bytes of one routed expert's weights (w13 + w2) in bf16, and of the shared MLP.
  size_t expert_bytes() const;
  size_t shared_bytes() const;
  size_t router_bytes() const;
  // The same in the checkpoint's fp8 form: one byte per weight plus the fp32 scale of each
  // 128x128 tile (gate and up tiled separately, as the checkpoints store them).
  size_t fp8_expert_bytes() const;
  size_t fp8_shared_bytes() const;
  // The same in an MX form (quant.kind Mxfp4 / Mxfp8): the packed elements (half a byte or one
  // byte each) plus one e8m0 byte per 32 input elements of every row. 0 for other kinds.
  size_t mx_expert_bytes() const;
  size_t mx_shared_bytes() const;
};

// How a config is read. A supported model_type (supported_model_types(): the families of
// DESIGN.md §5) is read as transformers 5.x reads it: a key the file omits takes the
// default of the family's transformers config class, and what the family's transformers modeling
// code fixes (e.g. DeepSeek-V3's sigmoid + correction-bias routing) applies whatever the file
// says (docs/configs.md). Any other model_type is an error naming the supported ones, unless
// allow_generic_moe: then the config is read as a generic top-k MoE, with no defaults beyond
// moekit's own and no fixed semantics.
struct SpecOptions {
  bool allow_generic_moe = false;
};
// The model_types read as transformers reads them, sorted.
std::vector<std::string> supported_model_types();

// Reads a model spec from a short name (a file configs/<name>.json in the config directory) or a
// path to a config.json (or a directory holding one). Throws moekit::Error naming the missing or
// inconsistent key and its value.
MoeSpec load_spec(const std::string& name_or_path, const SpecOptions& options = {});

// Parses config.json text. `name` is what the spec is called in messages.
MoeSpec parse_spec_json(const std::string& json_text, const std::string& name,
                        const SpecOptions& options = {});

// Checks the invariants every backend relies on; throws naming the field and value. With
// require_fusable, also that the shared width is a whole multiple of I.
void validate_spec(const MoeSpec& spec, bool require_fusable = false);

// The directory holding the built-in configs: $MOEKIT_CONFIG_DIR, else
// <directory of the running executable>/../share/moekit/configs when it exists (an installed
// CLI), else the source tree's configs/ (compiled in), else <install prefix>/share/moekit/configs.
std::string config_dir();
// Short names of the configs found in config_dir(), sorted.
std::vector<std::string> list_model_names();

}  // namespace moekit
