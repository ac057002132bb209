// The tensor-core ceilings (bf16, fp8) the layer benchmark's peak_fraction is judged against.
#pragma once

namespace moekit::cuda {

// cuBLAS bf16 x bf16 -> bf16 (fp32 accumulate) n^3 GEMM on random data, median of `reps` timed
// runs after warm-up, in TFLOP/s (2 n^3 / time).
double bench_bf16_gemm_tflops(int n = 8192, int reps = 20);

// The fp8 ceiling the same way: cuBLASLt e4m3 x e4m3 -> bf16 (fp32 accumulate, unit scales),
// the layout fp8 GEMMs take on Hopper (A transposed: both operands K-contiguous).
double bench_fp8_gemm_tflops(int n = 8192, int reps = 20);

}  // namespace moekit::cuda
