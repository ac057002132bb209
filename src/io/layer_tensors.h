// LayerTensors: one MoE layer's tensors in a checkpoint directory, found by name under the naming
// and layer prefix that resolve_layer_tensors picks, and checked (shape, dtype, block scale) from
// the headers only. Used by load_checkpoint_weights (checkpoint_weights.cpp); every message names
// the tensor, what was expected and what the checkpoint holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint_dir.h"
#include "io/checkpoint_names.h"
#include "io/matrix_source.h"
#include "moekit/spec.h"

namespace moekit::io {

class LayerTensors {
 public:
  LayerTensors(CheckpointDir& dir, const MoeSpec& spec, int layer, NameScheme scheme,
               std::string prefix)
      : dir_(dir), spec_(spec), layer_(layer), s_(std::move(scheme)), prefix_(std::move(prefix)) {}

  const NameScheme& scheme() const { return s_; }
  std::string full(const std::string& rel, int expert = -1) const {
    return prefix_ + expand(rel, layer_, expert);
  }
  bool has(const std::string& rel, int expert = -1) const { return dir_.has(full(rel, expert)); }

  TensorRef require(const std::string& rel, const std::vector<int64_t>& shape,
                    const std::string& what, int expert = -1);
  // A float tensor (BF16, F16 or F32) with the given shape.
  TensorRef require_float(const std::string& rel, const std::vector<int64_t>& shape,
                          const std::string& what);
  TensorRef require_u8(const std::string& rel, const std::vector<int64_t>& shape,
                       const std::string& what);

  // A [rows, cols] weight (or `stack` of them, taking number `index`): BF16/F16/F32, F8_E4M3
  // with a 128x128 block scale, or packed FP4 e2m1 (I8/U8 [rows, cols/2], low nibble first, as
  // DeepSeek-V4 publishes its experts) with a 1x32 e8m0 scale [rows, cols/32].
  MatrixSrc matrix(const std::string& rel, size_t rows, size_t cols, const std::string& what,
                   int expert = -1, int stack = 0, int index = 0);

 private:
  // The e8m0 scale of an mxfp8 weight: U8 or F8_E8M0 bytes, [.., rows, cols/32].
  TensorRef find_mx_scale(const TensorRef& w, const std::vector<int64_t>& shape,
                          const std::string& what);
  TensorRef find_scale(const TensorRef& w, const std::vector<int64_t>& shape,
                       const std::string& what, const char* blocks);

  CheckpointDir& dir_;
  const MoeSpec& spec_;
  int layer_;
  NameScheme s_;
  std::string prefix_;
};

// The first naming (spec family's first), block and layer prefix whose router tensor exists;
// throws naming what was tried and some of the names the checkpoint holds.
LayerTensors resolve_layer_tensors(CheckpointDir& dir, const MoeSpec& spec, int layer);

}  // namespace moekit::io
