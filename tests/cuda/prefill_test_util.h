// What the GPU prefill tests share (tests/cuda/test_prefill*.cpp): the skip without a GPU that
// runs the path, a checked CUDA call, and one cudaMalloc'ed buffer freed at scope end.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "cuda/prefill/prefill.h"
#include "moekit/cuda_layer.h"
#include "moekit/plan.h"

#define SKIP_WITHOUT_PREFILL_GPU()                                                     \
  do {                                                                                 \
    std::string why_;                                                                  \
    if (!moekit::cuda::available(&why_)) GTEST_SKIP() << "no usable GPU: " << why_;    \
    const char* why_prefill_ = nullptr;                                                \
    if (!moekit::cuda::prefill_supported(&why_prefill_)) GTEST_SKIP() << why_prefill_; \
  } while (0)

#define CUDA_OK(stmt) ASSERT_EQ((stmt), cudaSuccess) << #stmt

namespace moekit::test {

// One cudaMalloc'ed buffer, freed at scope end (a host vector's bytes copied in when given one).
struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) {
    if (n > 0 && cudaMalloc(&p, n) != cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc(" << n << ") failed";
      p = nullptr;
    }
  }
  template <typename T>
  Dev(const std::vector<T>& host) : Dev(host.size() * sizeof(T)) {
    if (p != nullptr) {
      EXPECT_EQ(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() {
    if (p != nullptr) (void)cudaFree(p);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  void poison() const { EXPECT_EQ(cudaMemset(p, 0xFF, bytes), cudaSuccess); }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> v(bytes / sizeof(T));
    EXPECT_EQ(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

// The grouped GEMM instances (rows of plan::grouped_gemm_kernels()) of one operand dtype: every
// row runs against the reference (an instance changes speed, never results).
inline std::vector<int> grouped_gemm_rows(bool fp8) {
  std::vector<int> rows;
  const auto kernels = plan::grouped_gemm_kernels();
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (kernels[i].fp8 == fp8) rows.push_back(static_cast<int>(i));
  }
  return rows;
}

}  // namespace moekit::test
