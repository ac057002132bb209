// The bf16 GEMM ceiling (gemm_ceiling.h).
#include "cuda/bench/gemm_ceiling.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "common/random_values.h"
#include "cuda/bench/graph_timing.h"
#include "cuda/common/cublas_check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "cuda/layer/random_fill.h"
#include "moekit/error.h"

namespace moekit::cuda {

double bench_bf16_gemm_tflops(int n, int reps) {
  MK_CHECK(n >= 256 && reps >= 1, "expected n >= 256 and reps >= 1, got " << n << ", " << reps);
  namespace bt = bench_timing;
  const size_t elems = static_cast<size_t>(n) * n;
  DeviceBuffer a(elems * 2), b(elems * 2), c(elems * 2);
  bt::Stream stream;
  // (random data: zeros run faster than real operands)
  fill_random_bf16(a.as<__nv_bfloat16>(), elems, 1, 4, -1, random_values::Tensor::Input, -1, 1.0f,
                   stream.s);
  fill_random_bf16(b.as<__nv_bfloat16>(), elems, 1, 5, -1, random_values::Tensor::Input, -1, 1.0f,
                   stream.s);
  cublasHandle_t handle = nullptr;
  MK_CUBLAS_CHECK(cublasCreate(&handle));
  std::unique_ptr<cublasContext, void (*)(cublasHandle_t)> guard(
      handle, [](cublasHandle_t h) { (void)cublasDestroy(h); });
  MK_CUBLAS_CHECK(cublasSetStream(handle, stream.s));
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    MK_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a.ptr,
                                 CUDA_R_16BF, n, b.ptr, CUDA_R_16BF, n, &beta, c.ptr, CUDA_R_16BF,
                                 n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  for (int i = 0; i < 3; ++i) gemm();
  bt::Events ev;
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    MK_CUDA_CHECK(cudaEventRecord(ev.a, stream.s));
    gemm();
    MK_CUDA_CHECK(cudaEventRecord(ev.b, stream.s));
    MK_CUDA_CHECK(cudaEventSynchronize(ev.b));
    MK_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev.a, ev.b));
  }
  std::sort(ms.begin(), ms.end());
  const double seconds = 1e-3 * ms[reps / 2];
  return 2.0 * n * static_cast<double>(n) * n / seconds / 1e12;
}

}  // namespace moekit::cuda
