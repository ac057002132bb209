// What a forward needs in memory, checked before anything is allocated, so that too many tokens
// or too wide a model is a refusal that names both numbers instead of an OOM kill or a bare
// std::bad_alloc half-way through.
//
// Host: the weights a forward touches (router, shared MLP, min(E, T x k) experts and the fused
// slots), the input, the activations of the CPU backends (fast and reference; the estimate is an
// upper bound of both) and the caller's extra workspace. Available: MemAvailable, and under an
// address-space limit (ulimit -v, RLIMIT_AS) what is left of it, whichever is smaller.
// Device: what GpuMoeLayer allocates for a spec and max_tokens, computable on the host.
#pragma once

#include <cstddef>
#include <string>

#include "moekit/expert_format.h"
#include "moekit/spec.h"

namespace moekit {

class LayerWeights;

struct HostMemoryEstimate {
  size_t weights = 0;      // host_bytes_needed(): router, shared MLP, touched experts, fused slots
  size_t inputs = 0;       // x [T, H] bf16
  size_t activations = 0;  // the output y [T, H] fp32, logits, routing, per-slot intermediates
  size_t workspace = 0;    // what the caller adds (a benchmark's read probe, a second output)
  size_t total() const { return weights + inputs + activations + workspace; }
};

// One forward over `tokens` tokens with the shared expert fused or not; workspace is 0.
HostMemoryEstimate host_memory_estimate(const MoeSpec& spec, int tokens, bool fused);

struct HostMemoryAvailable {
  size_t bytes = 0;          // 0: unknown (not Linux)
  const char* source = "";   // "MemAvailable" or "RLIMIT_AS" (address-space limit left)
};
HostMemoryAvailable host_memory_available();

// Throws "needs X GB of host memory for <what>: weights A, inputs B, activations C, workspace D;
// Y GB available (MemAvailable|RLIMIT_AS)" when need.total() exceeds what is available.
void check_host_memory(const HostMemoryEstimate& need, const std::string& what);

// The CPU API's check at the top of cpu_reference::forward and cpu_fast::forward: activations
// plus the experts this forward may still materialise. Free for small problems (below 256 MB it
// does not read /proc).
void check_forward_memory(const LayerWeights& w, int tokens, bool fused);

// Bytes of device memory GpuMoeLayer allocates for `spec` with room for max_tokens tokens: every
// expert and fused slot, shared MLP, router (weights), and the per-token workspace, plus the
// cuBLAS workspace of the shared dense path. Host-only, so it can be checked against
// cudaMemGetInfo before the first cudaMalloc.
// `experts`: the dtype the layer holds its experts in (BF16, or F8_E4M3: bytes and tile scales,
// the shared expert as fused slots only); `mx` Mxfp4 / Mxfp8 for MX experts (packed bytes and
// e8m0 bytes, the shared expert fused), else Bf16. `mx_widen_chunk`: the MX experts the prefill
// path widens to bf16 at a time (plan::LayerPlan::grouped_mx_chunk of a forward of max_tokens; 0
// none), or -1 for the plan's defaults.
size_t gpu_layer_device_bytes(const MoeSpec& spec, int max_tokens, DType experts = DType::BF16,
                              ExpertFormat mx = ExpertFormat::Bf16, int mx_widen_chunk = -1);

}  // namespace moekit
