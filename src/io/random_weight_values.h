// The formula of moekit's random weights, shared by the host (src/io/random_weights.cpp) and any
// device code that regenerates the same layer on the GPU: every value is a pure function of
// (seed, layer, tensor, expert, index), so both sides produce bit-identical tensors.
//
//   stream = random_values::stream_key(seed, layer, tensor, expert)   expert = -1 if not per-expert
//   u      = random_values::uniform(stream, index)                     in [-1, 1), exact in fp32
//
//   tensor          expert  index               value (fp32 math, then stored type)
//   RouterWeight    -1      r*H + c, r < E+1    round_to_bf16(u * scale(H)) in bf16; u * scale(H)
//                                               unrounded when router_dtype is F32. Row E (Qwen2's
//                                               shared gate row) simply continues the index.
//   CorrectionBias  -1      e                   u * 0.02f    (fp32, not rounded)
//   RouterBias      -1      e                   u * 0.1f     (fp32, gpt-oss only)
//   ExpertW13       e       r*H + c, r < 2I     round_to_bf16(u * scale(H))
//   ExpertW2        e       r*I + c, r < H      round_to_bf16(u * scale(I))
//   ExpertB13       e       r, r < 2I           u * 0.1f     (fp32, gpt-oss only)
//   ExpertB2        e       r, r < H            u * 0.1f     (fp32, gpt-oss only)
//   SharedW13       -1      r*H + c, r < 2*Is   round_to_bf16(u * scale(H))
//   SharedW2        -1      r*Is + c, r < H     round_to_bf16(u * scale(Is))
//
//   scale(n) = float(1.0 / sqrt(double(n)))  (1/sqrt(fan_in): keeps each GEMM's output O(1))
//
// The product u * scale is one IEEE fp32 multiplication (no fma can be contracted into it), and
// the double sqrt is correctly rounded on host and device, so no fast-math setting changes it.
// Fused shared slots are not generated: they are slices of SharedW13/SharedW2 (weights.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/random_values.h"

namespace moekit::random_values {

MK_HOST_DEVICE inline float weight_scale(int fan_in) {
  return static_cast<float>(1.0 / sqrt(static_cast<double>(fan_in)));
}

// Unrounded fp32 value of a weight (the bf16 tensors store its round-to-nearest-even).
MK_HOST_DEVICE inline float weight_value(uint64_t stream, uint64_t index, float scale) {
  return uniform(stream, index) * scale;
}

// Small next to the sigmoid scores' spread (~0.08 for O(1) inputs): the bias still shifts picks,
// but tokens spread over the experts as in a load-balanced model (a larger bias would send every
// token to the same few experts and make benchmarks read far fewer bytes than real traffic).
constexpr float kCorrectionBiasScale = 0.02f;
constexpr float kBiasScale = 0.1f;  // router bias and expert biases (gpt-oss)

}  // namespace moekit::random_values
