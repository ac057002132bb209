// A matrix inside a checkpoint tensor (MatrixSrc) and its readers: in place where it is bf16
// already, else converted (F16/F32 widening, F8_E4M3 block dequantisation, MXFP4 decoding) into
// bf16; float regions into fp32. Used by load_checkpoint_weights (checkpoint_layer.h).
#pragma once

#include <cstddef>

#include "io/checkpoint_dir.h"
#include "moekit/dtype.h"

namespace moekit::io {

// A [rows, cols] matrix inside a tensor: the whole 2-D tensor, or expert e of a stacked one.
struct MatrixSrc {
  TensorRef w;
  size_t offset = 0;  // elements before the matrix
  size_t rows = 0, cols = 0;
  DType dtype = DType::BF16;
  bool fp4 = false;  // packed e2m1, two per byte: offset counts bytes
  bool mx8 = false;  // F8_E4M3 with a 1x32 e8m0 scale (an mxfp8 checkpoint)
  TensorRef scale;   // F8_E4M3: [ceil(rows/128), ceil(cols/128)]; fp4, mx8: [rows, cols/32]
  size_t scale_offset = 0;
};

// Pointer into the mapping when the matrix is bf16 and 2-byte aligned, else null.
const Bf16* direct_bf16(const MatrixSrc& m);
// The matrix as bf16 [rows, cols] into `out`.
void read_bf16(const MatrixSrc& m, Bf16* out);
// `count` values of a float tensor from element `offset`, as fp32.
void read_f32(const TensorRef& t, size_t offset, size_t count, float* out);

}  // namespace moekit::io
