// Shared-memory carveout for the router GEMM kernels, which run beside the bulk expert kernels.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <utility>

#include "cuda/cuda_check.h"

namespace moekit::cuda {

// Asks the driver to run `kernel` with the SM's L1 / shared-memory split at its largest shared
// part (once per kernel and device). why: the down kernel lets the next layer's router GEMM
// launch early (PDL) so that its CTAs load their weights beside the down kernel's; a small
// kernel run with a large L1 leaves too little shared memory for that (the bulk expert kernels
// hold ~210 KB per SM, and the split changes only while an SM is empty). Measured with
// `moekit bench --trace` (bench/results/h200/2026-11-30-s3-run3 against -s3-run5): with both,
// the routing kernel starts ~1 us sooner after the previous layer.
inline void prefer_max_shared_carveout(const void* kernel) {
  static std::mutex mutex;
  static std::set<std::pair<int, const void*>> done;
  int device = 0;
  MK_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (!done.insert({device, kernel}).second) return;
  MK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
}

}  // namespace moekit::cuda
