// LayerWeights: one MoE layer's weights in moekit's layout, from a checkpoint or from a seed.
//
// Layout (DESIGN.md §1-2), all row-major:
//   router_weight     [router_columns(), H]  bf16 or fp32 (spec.router_dtype); for a gated shared
//                                            expert (Qwen2-MoE) row E is its gate row
//   router_bias       [E] fp32               gpt-oss only
//   correction_bias   [E] fp32               e_score_correction_bias, selection only
//   expert(e).w13     [2I, H] bf16           gate rows [0,I), then up rows [I,2I)
//   expert(e).w2      [H, I] bf16
//   expert(e).b13/b2  [2I] / [H] fp32        gpt-oss only
//   shared_w13        [2*Is, H] bf16         the unfused shared MLP (Is = shared_intermediate)
//   shared_w2         [H, Is] bf16
// Loaded with LoadOptions::expert_format Fp8Block (an fp8 block-scale checkpoint), the expert and
// shared weights are e4m3 bytes + fp32 128x128 tile scales instead (ExpertView's fp8 fields,
// shared_*_fp8 / shared_*_scale), the bf16 pointers null; docs/decisions/fp8_experts.md.
// Loaded with LoadOptions::expert_format Mxfp4 / Mxfp8 (an OCP MX checkpoint: gpt-oss, MiniMax-M3
// style), they are the packed elements + one e8m0 exponent byte per 32 input elements instead
// (ExpertView's mx fields, shared_*_mx / shared_*_mx_scale); docs/decisions/mx_experts.md.
//
// expert(e) for E <= e < E+S is fused shared slot j = e-E: gate/up rows [jI,(j+1)I) of the shared
// MLP and down columns [jI,(j+1)I), repacked once into the expert layout. Summing the S slots
// reproduces the shared MLP exactly, since SwiGLU is elementwise over the intermediate dimension.
//
// Experts are materialised lazily and thread-safely: a checkpoint expert's pages are mapped (and
// converted to bf16 if stored otherwise) on first use, a random expert is generated on first use
// from (seed, layer, expert). A forward touches only the experts it routes to, so a DeepSeek-V3
// layer (22.6 GB of experts) runs in a few GB.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moekit/dtype.h"
#include "moekit/expert_format.h"
#include "moekit/memory_estimate.h"
#include "moekit/spec.h"

namespace moekit {

struct ExpertView {
  const Bf16* w13 = nullptr;  // [2I, H]
  const Bf16* w2 = nullptr;   // [H, I]
  const float* b13 = nullptr; // [2I] or null
  const float* b2 = nullptr;  // [H] or null
  // The fp8 form, set instead of w13/w2 when LayerWeights::expert_dtype() is F8_E4M3:
  // w = fp8 x scale per 128x128 tile, the tiles at the right and bottom edges partial. Gate and up
  // are tiled separately, as the checkpoints store them, so the gate's tile rows are followed by
  // the up's; with I % 128 == 0 that is the [ceil(2I/128), ceil(H/128)] grid of the stacked w13.
  const uint8_t* w13_fp8 = nullptr;  // [2I, H] e4m3fn: gate rows [0,I), then up rows [I,2I)
  const float* w13_scale = nullptr;  // [2*ceil(I/128), ceil(H/128)] fp32: gate tiles, up tiles
  const uint8_t* w2_fp8 = nullptr;   // [H, I] e4m3fn
  const float* w2_scale = nullptr;   // [ceil(H/128), ceil(I/128)] fp32
  // The MX form, set instead of w13/w2 when LayerWeights::expert_format() is Mxfp4 or Mxfp8:
  // w[r][c] = element(r, c) x 2^(scale[r][c / 32] - 127). Mxfp4 rows hold two e2m1 codes a byte,
  // the even column in the low nibble (gpt-oss's order); Mxfp8 rows one e4m3fn code a byte. The
  // scales are the checkpoint's e8m0 bytes, never converted (255, NaN, is rejected at load).
  const uint8_t* w13_mx = nullptr;        // [2I, mx_row_bytes(H)]: gate rows, then up rows
  const uint8_t* w13_mx_scale = nullptr;  // [2I, H/32] e8m0
  const uint8_t* w2_mx = nullptr;         // [H, mx_row_bytes(I)]
  const uint8_t* w2_mx_scale = nullptr;   // [H, I/32] e8m0
  ExpertFormat mx_format = ExpertFormat::Bf16;  // Mxfp4 or Mxfp8 when w13_mx is set
};

class LayerWeights {
 public:
  virtual ~LayerWeights() = default;

  const MoeSpec& spec() const { return spec_; }
  int layer() const { return layer_; }

  DType router_dtype() const { return spec_.router_dtype; }
  // Virtual so that a view of borrowed memory (moekit/moe.h: ViewLayerWeights) can answer them.
  virtual const void* router_weight() const { return router_weight_.data(); }  // [cols, H]
  virtual const float* router_bias() const {
    return router_bias_.empty() ? nullptr : router_bias_.data();
  }
  virtual const float* correction_bias() const {
    return correction_bias_.empty() ? nullptr : correction_bias_.data();
  }

  virtual const Bf16* shared_w13() const {
    return shared_w13_.empty() ? nullptr : shared_w13_.data();
  }
  virtual const Bf16* shared_w2() const { return shared_w2_.empty() ? nullptr : shared_w2_.data(); }

  // How the experts and the shared MLP are held: Bf16 (expert(e).w13/w2, shared_w13/w2),
  // Fp8Block (expert(e).w13_fp8/..., the shared_*_fp8 / _scale below) or Mxfp4 / Mxfp8
  // (expert(e).w13_mx/..., shared_*_mx / _mx_scale); the bf16 pointers are null unless Bf16.
  ExpertFormat expert_format() const { return expert_format_; }
  // F8_E4M3 for Fp8Block, else BF16 (the MX formats answer through expert_format()).
  DType expert_dtype() const {
    return expert_format_ == ExpertFormat::Fp8Block ? DType::F8_E4M3 : DType::BF16;
  }
  // The shared MLP in fp8, laid out as ExpertView's fp8 fields with I -> Is: w13 [2Is, H],
  // w13 scale [2*ceil(Is/128), ceil(H/128)], w2 [H, Is], w2 scale [ceil(H/128), ceil(Is/128)].
  const uint8_t* shared_w13_fp8() const { return ptr(shared_w13_fp8_); }
  const float* shared_w13_scale() const { return ptr(shared_w13_scale_); }
  const uint8_t* shared_w2_fp8() const { return ptr(shared_w2_fp8_); }
  const float* shared_w2_scale() const { return ptr(shared_w2_scale_); }
  // The shared MLP in an MX format, laid out as ExpertView's mx fields with I -> Is.
  const uint8_t* shared_w13_mx() const { return ptr(shared_w13_mx_); }
  const uint8_t* shared_w13_mx_scale() const { return ptr(shared_w13_mx_scale_); }
  const uint8_t* shared_w2_mx() const { return ptr(shared_w2_mx_); }
  const uint8_t* shared_w2_mx_scale() const { return ptr(shared_w2_mx_scale_); }

  // Routed expert (e < E) or fused shared slot (E <= e < E + shared_slots()).
  // Thread-safe; materialises on first use; the pointers stay valid for the object's life.
  virtual ExpertView expert(int e) const = 0;
  // Materialise these experts now (e.g. before timing, or in parallel before a forward).
  void prefetch(const std::vector<int>& experts) const;
  // How many experts have been materialised so far (for tests of laziness and memory reports).
  virtual int materialised_experts() const = 0;
  // Where the weights came from ("random seed 0" or the checkpoint directory).
  virtual std::string origin() const = 0;
  // The seed of make_random_weights' weights (the GPU regenerates them on the device instead of
  // uploading every expert), else nullopt.
  virtual std::optional<uint64_t> random_seed() const { return std::nullopt; }

 protected:
  LayerWeights(MoeSpec spec, int layer) : spec_(std::move(spec)), layer_(layer) {}

  MoeSpec spec_;
  int layer_;
  std::vector<uint8_t> router_weight_;  // raw bytes, router_dtype
  std::vector<float> router_bias_;
  std::vector<float> correction_bias_;
  std::vector<Bf16> shared_w13_;
  std::vector<Bf16> shared_w2_;
  ExpertFormat expert_format_ = ExpertFormat::Bf16;
  std::vector<uint8_t> shared_w13_fp8_, shared_w2_fp8_;
  std::vector<float> shared_w13_scale_, shared_w2_scale_;
  std::vector<uint8_t> shared_w13_mx_, shared_w13_mx_scale_, shared_w2_mx_, shared_w2_mx_scale_;

 private:
  template <typename T>
  static const T* ptr(const std::vector<T>& v) {
    return v.empty() ? nullptr : v.data();
  }
};

// Deterministic random weights: every value a function of (seed, layer, tensor, index), scaled
// so a layer's output is O(1) for O(1) inputs. Experts are generated on first use.
// format: how the experts and the shared MLP are held. Fp8Block / Mxfp4 / Mxfp8 quantise the
// same bf16 values as save_checkpoint writes those forms (fp8: 128x128 tiles of amax / 448, gate
// and up tiled separately, powers of two under spec.quant.scale_ue8m0; MX: OCP MX per row, which
// needs H and I multiples of 32), so a benchmark of a format needs no checkpoint on disk.
std::unique_ptr<LayerWeights> make_random_weights(const MoeSpec& spec, int layer, uint64_t seed,
                                                  ExpertFormat format = ExpertFormat::Bf16);

struct LoadOptions {
  // How expert and shared-MLP weights are held. Bf16 (the default, and what the CUDA layer
  // uploads): every float or quantised storage converted to bf16 on first use. Fp8Block: an fp8
  // block-scale checkpoint's e4m3 bytes kept as stored (mapped in place where the layout allows)
  // with fp32 tile scales, for the fp8 compute paths; any expert tensor that is not F8_E4M3 with
  // a 128x128 scale is then an error. Mxfp4 / Mxfp8: an MX checkpoint's packed bytes and e8m0
  // scale bytes kept as stored (io/mx_experts.h); any other storage is then an error.
  ExpertFormat expert_format = ExpertFormat::Bf16;
};

// Weights of MoE layer `layer` from a checkpoint directory (*.safetensors, with or without
// model.safetensors.index.json), under the names the published checkpoints use for the spec's
// family (per-expert or stacked forms). Throws naming the missing tensor or the wrong shape/dtype.
std::unique_ptr<LayerWeights> load_checkpoint_weights(const MoeSpec& spec, int layer,
                                                      const std::string& dir,
                                                      const LoadOptions& options = {});

// Memory a forward over `tokens` tokens needs on the host: router, shared expert, and at most
// min(E, tokens * k) materialised experts (+ fused slots), in bytes.
size_t host_bytes_needed(const MoeSpec& spec, int tokens, bool fused);
// Throws "needs X GB of host memory for <spec> ..., Y GB available" when the whole estimate of
// one forward (host_memory_estimate: weights, input, activations) exceeds what is available.
void check_host_memory(const MoeSpec& spec, int tokens, bool fused);

}  // namespace moekit
