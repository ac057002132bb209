// Timing of the prefill path (prefill.h) and the bf16 GEMM ceiling it is judged against, on the
// GPU (prefill_bench.cu). Until the layer plan takes the path, the GPU test binary calls these
// (tests/cuda/test_prefill.cpp, GpuPrefillBench: disabled by default, run on request).
#pragma once

#include <cstddef>
#include <string>

#include "moekit/spec.h"

namespace moekit::cuda {

struct PrefillBenchRecord {
  std::string model;
  int tokens = 0, slots = 0, rows = 0, hidden = 0, inter = 0;
  bool fused = false;
  double us = 0;             // median CUDA-graph replay of launch_prefill_experts
  double expert_flops = 0;   // prefill_expert_flops: the two grouped GEMMs
  double expert_tflops = 0;  // expert_flops / us
  size_t workspace_bytes = 0;
};

// One forward of the prefill path for `spec` (its real shapes; weights random on the device) at
// `tokens` tokens, each token taking top_k distinct experts spread evenly (start by a hash of
// the token, step E / top_k) and, fused, the S shared slots; the median of `reps` replays.
// Weights are E(+S) x (w13 + w2): the caller's GPU must hold them (DeepSeek-V3: 22.6 GB).
PrefillBenchRecord bench_prefill(const MoeSpec& spec, int tokens, bool fused, int reps = 20);

// The bf16 tensor-core ceiling: cuBLAS bf16 x bf16 -> bf16 (fp32 accumulate) n^3 GEMM, median of
// `reps` timed runs after warm-up, in TFLOP/s (2 n^3 / time).
double bench_bf16_gemm_tflops(int n = 8192, int reps = 20);

}  // namespace moekit::cuda
