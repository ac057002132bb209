// Deterministic random weights: one value per (seed, layer, tensor, expert, index), computable on
// the host and on the device alike, so the GPU can fill a 22 GB layer itself and still hold
// exactly the values the CPU reference generates lazily (src/io/random_weights.cpp).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MK_HOST_DEVICE __host__ __device__
#else
#define MK_HOST_DEVICE
#endif

namespace moekit::random_values {

// Which tensor of a layer a value belongs to; part of the stream key.
enum class Tensor : uint32_t {
  RouterWeight = 1,    // [router_columns, H]
  CorrectionBias = 2,  // [E]
  RouterBias = 3,      // [E]
  ExpertW13 = 4,       // per expert [2I, H]
  ExpertW2 = 5,        // per expert [H, I]
  ExpertB13 = 6,       // per expert [2I]
  ExpertB2 = 7,        // per expert [H]
  SharedW13 = 8,       // [2*Is, H]
  SharedW2 = 9,        // [H, Is]
  Input = 10,          // activations x [T, H] for runs and benchmarks
};

// splitmix64's finaliser: a bijective 64-bit mix with good avalanche.
MK_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The stream of one tensor (of one expert, -1 for non-expert tensors) of one layer.
MK_HOST_DEVICE inline uint64_t stream_key(uint64_t seed, int layer, Tensor tensor, int expert) {
  uint64_t k = mix64(seed);
  k = mix64(k ^ (static_cast<uint64_t>(static_cast<uint32_t>(layer)) << 32 |
                 static_cast<uint32_t>(tensor)));
  return mix64(k ^ static_cast<uint64_t>(static_cast<int64_t>(expert)));
}

// Uniform in [-1, 1): 24 random bits, so the float is exact.
MK_HOST_DEVICE inline float uniform(uint64_t stream, uint64_t index) {
  const uint64_t bits = mix64(stream ^ (index * 0xd1b54a32d192ed03ull));
  return static_cast<float>(static_cast<int32_t>(bits >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}

}  // namespace moekit::random_values
