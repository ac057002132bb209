// DeviceBuffer: one cudaMalloc'ed allocation of a fixed size, freed when it goes out of scope
// (also when an exception unwinds), for the host code around the kernels (timers, benchmarks,
// probes). The layer keeps its own, sized at creation with an error naming the free memory
// (src/cuda/layer/layer.cu).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "cuda/cuda_check.h"

namespace moekit::cuda {

struct DeviceBuffer {
  void* ptr = nullptr;
  // why at least 16 bytes: a zero-byte request still yields a valid, 16-byte-aligned pointer
  explicit DeviceBuffer(size_t bytes) {
    MK_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(bytes, 16)));
  }
  ~DeviceBuffer() { MK_CUDA_WARN(cudaFree(ptr)); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

}  // namespace moekit::cuda
