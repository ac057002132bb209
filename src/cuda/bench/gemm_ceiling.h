// The bf16 tensor-core ceiling the layer benchmark's peak_fraction is judged against.
#pragma once

namespace moekit::cuda {

// cuBLAS bf16 x bf16 -> bf16 (fp32 accumulate) n^3 GEMM on random data, median of `reps` timed
// runs after warm-up, in TFLOP/s (2 n^3 / time).
double bench_bf16_gemm_tflops(int n = 8192, int reps = 20);

}  // namespace moekit::cuda
