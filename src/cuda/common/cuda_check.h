// MK_CUDA_CHECK: every CUDA runtime call in moekit goes through it.
//
// On failure it throws moekit::Error whose message names the statement, the CUDA error name and
// string, and the device; the Error records function and file:line like MK_CHECK. Library code
// throws; only main() turns the error into an exit status. MK_CUDA_WARN is the print-only variant
// for destructors and other places that must not throw.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "moekit/error.h"

namespace moekit::cuda::detail {

inline std::string cuda_error_message(cudaError_t err, const char* statement) {
  int device = -1;
  // why: a failed call may leave a sticky error; cudaGetDevice still answers in that state.
  if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  std::ostringstream os;
  os << "CUDA call '" << statement << "' failed: " << cudaGetErrorName(err) << " ("
     << cudaGetErrorString(err) << ") on device " << device;
  return os.str();
}

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* statement,
                                          const char* function, const char* file, int line) {
  ::moekit::detail::throw_error(cuda_error_message(err, statement), function, file, line);
}

}  // namespace moekit::cuda::detail

#define MK_CUDA_CHECK(stmt)                                                                   \
  do {                                                                                        \
    const cudaError_t mk_cuda_err_ = (stmt);                                                  \
    if (mk_cuda_err_ != cudaSuccess) {                                                        \
      ::moekit::cuda::detail::throw_cuda_error(mk_cuda_err_, #stmt, __func__, __FILE__,       \
                                               __LINE__);                                     \
    }                                                                                         \
  } while (0)

// Print-only: for destructors (a throw there would terminate). Silent on
// cudaErrorCudartUnloading: at process exit (layers that the Python ops' cache holds until the
// interpreter ends) the runtime is unloading and reclaims the memory and streams itself.
#define MK_CUDA_WARN(stmt)                                                                    \
  do {                                                                                        \
    const cudaError_t mk_cuda_err_ = (stmt);                                                  \
    if (mk_cuda_err_ != cudaSuccess && mk_cuda_err_ != cudaErrorCudartUnloading) {            \
      std::fprintf(stderr, "moekit: %s (in %s at %s:%d)\n",                                   \
                   ::moekit::cuda::detail::cuda_error_message(mk_cuda_err_, #stmt).c_str(),   \
                   __func__, __FILE__, __LINE__);                                             \
    }                                                                                         \
  } while (0)

// After a kernel launch: the launch configuration error, if any (does not synchronise).
#define MK_CUDA_CHECK_LAUNCH() MK_CUDA_CHECK(cudaGetLastError())
