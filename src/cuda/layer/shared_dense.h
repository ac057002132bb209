// The unfused shared MLP as dense GEMMs: out[T, H] = (act(x W1s^T, x W3s^T)) W2s^T, fp32 out.
//
// The expert kernels split the shared MLP (one dense "expert" every token routes to) into tasks
// of <= 8 tokens, and each task streams the whole 88 MB of DeepSeek-V3's shared weights: at 128
// tokens 16 times, 15 of them from L2 (docs/decisions/shared_dense.md). Here cuBLAS reads them
// once: gate/up [T, 2Is] in fp32, the expert kernels' activation to bf16 h [T, Is] (so h is the
// bf16 value the kernels would store), down into the fp32 [T, H] the down kernel's combine adds
// (ExpertsParams::shared_partial). Three launches, no host synchronisation: capturable.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moekit/spec.h"

namespace moekit::cuda {

// The activation of the gate and up rows (spec.activation, swiglu_limit / alpha / beta).
struct SharedActivation {
  Activation activation = Activation::Silu;
  float limit = 0.0f;
  float alpha = 0.0f;
  float beta = 0.0f;
};

class SharedDenseMlp {
 public:
  // Creates the cuBLAS handle, its fixed workspace and the fp32 gate/up buffer for max_tokens
  // (outside any capture: a forward never allocates).
  SharedDenseMlp(int max_tokens, int hidden, int inter);
  ~SharedDenseMlp();
  SharedDenseMlp(const SharedDenseMlp&) = delete;
  SharedDenseMlp& operator=(const SharedDenseMlp&) = delete;

  // w13 [2 inter, hidden] (gate rows then up rows), w2 [hidden, inter], x [tokens, hidden] bf16;
  // h [tokens, inter] bf16 (scratch), out [tokens, hidden] fp32.
  void forward(const __nv_bfloat16* x, const __nv_bfloat16* w13, const __nv_bfloat16* w2,
               int tokens, const SharedActivation& act, __nv_bfloat16* h, float* out,
               cudaStream_t stream);

 private:
  void release();

  int max_tokens_ = 0, hidden_ = 0, inter_ = 0;
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  float* gate_up_ = nullptr;  // [max_tokens, 2 inter]
};

}  // namespace moekit::cuda
