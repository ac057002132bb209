// MK_CUBLAS_CHECK: every cuBLAS call in moekit goes through it. On failure it throws
// moekit::Error naming the statement and the status (like MK_CUDA_CHECK for the runtime).
#pragma once

#include <cublas_v2.h>

#include "moekit/error.h"

namespace moekit::cuda::detail {

inline const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "CUBLAS_STATUS_(unknown)";
  }
}

}  // namespace moekit::cuda::detail

#define MK_CUBLAS_CHECK(stmt)                                                       \
  do {                                                                              \
    const cublasStatus_t mk_cublas_status_ = (stmt);                                \
    MK_CHECK(mk_cublas_status_ == CUBLAS_STATUS_SUCCESS,                            \
             "cuBLAS call '" #stmt "' failed: "                                     \
                 << ::moekit::cuda::detail::cublas_status_name(mk_cublas_status_)); \
  } while (0)
