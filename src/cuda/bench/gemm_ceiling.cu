// The bf16 and fp8 GEMM ceilings (gemm_ceiling.h).
#include "cuda/bench/gemm_ceiling.h"

#include <cublasLt.h>
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
namespace {

// Median of `reps` timed runs of `gemm` in `stream` after 3 untimed ones, as 2 n^3 / time.
template <typename F>
double time_gemm_tflops(int n, int reps, cudaStream_t stream, F&& gemm) {
  namespace bt = bench_timing;
  for (int i = 0; i < 3; ++i) gemm();
  bt::Events ev;
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    MK_CUDA_CHECK(cudaEventRecord(ev.a, stream));
    gemm();
    MK_CUDA_CHECK(cudaEventRecord(ev.b, stream));
    MK_CUDA_CHECK(cudaEventSynchronize(ev.b));
    MK_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev.a, ev.b));
  }
  std::sort(ms.begin(), ms.end());
  const double seconds = 1e-3 * ms[reps / 2];
  return 2.0 * n * static_cast<double>(n) * n / seconds / 1e12;
}

}  // namespace

double bench_fp8_gemm_tflops(int n, int reps) {
  MK_CHECK(n >= 256 && n % 16 == 0 && reps >= 1,
           "expected n >= 256, a multiple of 16, and reps >= 1, got " << n << ", " << reps);
  namespace bt = bench_timing;
  const size_t elems = static_cast<size_t>(n) * n;
  const size_t ws_bytes = size_t{32} << 20;
  DeviceBuffer a(elems), b(elems), c(elems * 2), ws(ws_bytes);
  bt::Stream stream;
  fill_random_e4m3(a.as<uint8_t>(), elems, 1, 4, -1, random_values::Tensor::Input, -1, stream.s);
  fill_random_e4m3(b.as<uint8_t>(), elems, 1, 5, -1, random_values::Tensor::Input, -1, stream.s);
  // cuBLASLt's objects, released in reverse order of creation
  struct Lt {
    cublasLtHandle_t handle = nullptr;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~Lt() {
      if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
      if (c) (void)cublasLtMatrixLayoutDestroy(c);
      if (b) (void)cublasLtMatrixLayoutDestroy(b);
      if (a) (void)cublasLtMatrixLayoutDestroy(a);
      if (op) (void)cublasLtMatmulDescDestroy(op);
      if (handle) (void)cublasLtDestroy(handle);
    }
  } lt;
  MK_CUBLAS_CHECK(cublasLtCreate(&lt.handle));
  MK_CUBLAS_CHECK(cublasLtMatmulDescCreate(&lt.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans = CUBLAS_OP_T, none = CUBLAS_OP_N;
  MK_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans,
                                                 sizeof trans));
  MK_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSB, &none,
                                                 sizeof none));
  MK_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.a, CUDA_R_8F_E4M3, n, n, n));
  MK_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.b, CUDA_R_8F_E4M3, n, n, n));
  MK_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.c, CUDA_R_16BF, n, n, n));
  MK_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&lt.pref));
  MK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  MK_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt.handle, lt.op, lt.a, lt.b, lt.c, lt.c,
                                                 lt.pref, 1, &heur, &found));
  MK_CHECK(found > 0, "cuBLASLt has no e4m3 GEMM of " << n << "^3 on this device");
  const float alpha = 1.0f, beta = 0.0f;
  return time_gemm_tflops(n, reps, stream.s, [&] {
    MK_CUBLAS_CHECK(cublasLtMatmul(lt.handle, lt.op, &alpha, a.ptr, lt.a, b.ptr, lt.b, &beta,
                                   c.ptr, lt.c, c.ptr, lt.c, &heur.algo, ws.ptr, ws_bytes,
                                   stream.s));
  });
}

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
  return time_gemm_tflops(n, reps, stream.s, gemm);
}

}  // namespace moekit::cuda
