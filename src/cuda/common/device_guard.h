// DeviceGuard: the library leaves the caller's current CUDA device as it found it.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.h"

namespace moekit::cuda {

// Makes `device` current for its scope and restores the caller's device after (the library
// leaves the caller's current device as it found it).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    MK_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) MK_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) {
      MK_CUDA_WARN(cudaSetDevice(previous_));
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace moekit::cuda
