// DeviceBuffer: one cudaMalloc'ed allocation, freed when it goes out of scope (also when an
// exception unwinds). A failed allocation throws naming the bytes asked for and the bytes free.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <utility>

#include "cuda/common/cuda_check.h"
#include "moekit/error.h"

namespace moekit::cuda {

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;

  DeviceBuffer() = default;
  // why at least 16 bytes: a zero-byte request still yields a valid, 16-byte-aligned pointer
  explicit DeviceBuffer(size_t n) : bytes(n) {
    const cudaError_t err = cudaMalloc(&ptr, std::max<size_t>(n, 16));
    if (err != cudaSuccess) {
      ptr = nullptr;
      size_t free_b = 0, total_b = 0;
      (void)cudaGetLastError();
      (void)cudaMemGetInfo(&free_b, &total_b);
      MK_FAIL("cudaMalloc of " << n << " bytes failed (" << cudaGetErrorName(err) << "): " << free_b
                               << " of " << total_b << " bytes free on the device");
    }
  }
  ~DeviceBuffer() {
    if (ptr != nullptr) MK_CUDA_WARN(cudaFree(ptr));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr(std::exchange(o.ptr, nullptr)), bytes(std::exchange(o.bytes, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr, o.ptr);
    std::swap(bytes, o.bytes);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

// buf = count elements of T (none for count 0: buf stays empty and the result is null), adding
// the bytes to `total`.
template <typename T>
T* allocate(DeviceBuffer& buf, size_t count, size_t& total) {
  MK_CHECK(buf.ptr == nullptr, "device buffer allocated twice");
  if (count == 0) return nullptr;
  buf = DeviceBuffer(count * sizeof(T));
  total += buf.bytes;
  return buf.as<T>();
}

}  // namespace moekit::cuda
