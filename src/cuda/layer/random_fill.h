// On-device generation of make_random_weights' values (src/io/random_weight_values.h has the
// formula): value i of (seed, layer, tensor, expert) = uniform(stream_key(...), i) * scale, stored
// as bf16 (round to nearest even, as float_to_bf16) or fp32. Bit-identical to the host.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/random_values.h"

namespace moekit::cuda {

// Fills `experts` consecutive tensors of `count` values each; tensor j uses expert id
// first_expert + j, or -1 for every j when first_expert < 0 (non-expert tensors, experts == 1).
void fill_random_bf16(__nv_bfloat16* dst, size_t count, int experts, uint64_t seed, int layer,
                      random_values::Tensor tensor, int first_expert, float scale,
                      cudaStream_t stream);
void fill_random_f32(float* dst, size_t count, int experts, uint64_t seed, int layer,
                     random_values::Tensor tensor, int first_expert, float scale,
                     cudaStream_t stream);
// e4m3 codes of uniform values over [-448, 448] (the same stream as the bf16 fill's), for fp8
// layers: with tile scales of weight_scale / 448 (fill_f32) the weights span the bf16 fill's range.
void fill_random_e4m3(uint8_t* dst, size_t count, int experts, uint64_t seed, int layer,
                      random_values::Tensor tensor, int first_expert, cudaStream_t stream);
// dst[0..count) = value.
void fill_f32(float* dst, size_t count, float value, cudaStream_t stream);

}  // namespace moekit::cuda
