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
#include "moekit/memory_estimate.h"
#include "moekit/spec.h"

namespace moekit {

struct ExpertView {
  const Bf16* w13 = nullptr;  // [2I, H]
  const Bf16* w2 = nullptr;   // [H, I]
  const float* b13 = nullptr; // [2I] or null
  const float* b2 = nullptr;  // [H] or null
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
};

// Deterministic random weights: every value a function of (seed, layer, tensor, index), scaled
// so a layer's output is O(1) for O(1) inputs. Experts are generated on first use.
std::unique_ptr<LayerWeights> make_random_weights(const MoeSpec& spec, int layer, uint64_t seed);

// Weights of MoE layer `layer` from a checkpoint directory (*.safetensors, with or without
// model.safetensors.index.json), under the names the published checkpoints use for the spec's
// family (per-expert or stacked forms). Throws naming the missing tensor or the wrong shape/dtype.
std::unique_ptr<LayerWeights> load_checkpoint_weights(const MoeSpec& spec, int layer,
                                                      const std::string& dir);

// Memory a forward over `tokens` tokens needs on the host: router, shared expert, and at most
// min(E, tokens * k) materialised experts (+ fused slots), in bytes.
size_t host_bytes_needed(const MoeSpec& spec, int tokens, bool fused);
// Throws "needs X GB of host memory for <spec> ..., Y GB available" when the whole estimate of
// one forward (host_memory_estimate: weights, input, activations) exceeds what is available.
void check_host_memory(const MoeSpec& spec, int tokens, bool fused);

}  // namespace moekit
