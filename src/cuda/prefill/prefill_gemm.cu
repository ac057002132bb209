// The prefill grouped GEMM's entry (prefill_gemm.h): the device check and the instance a launch
// takes by its tile's rows. The instances themselves are prefill_gemm_m*.cu (only they see
// CUTLASS).
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "cuda/common/cuda_check.h"
#include "cuda/prefill/prefill_gemm.h"
#include "moekit/error.h"

namespace moekit::cuda {

bool prefill_tile_m_supported(int tile_m) { return tile_m == 128 || tile_m == 64; }

int prefill_sm_count() {
  static int count = 0;
  static std::once_flag once;
  std::call_once(once, [] {
    int device = 0;
    MK_CUDA_CHECK(cudaGetDevice(&device));
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  });
  return count;
}

bool prefill_gemm_supported(const char** why) {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    if (why != nullptr) *why = "no usable CUDA device";
    return false;
  }
  if (major != 9 || minor != 0) {
    if (why != nullptr) *why = "the prefill GEMM is built for sm_90a (compute capability 9.0)";
    return false;
  }
  return true;
}

size_t prefill_gemm_workspace_bytes(int groups) {
  return std::max(prefill_gemm_m128_workspace_bytes(groups),
                  prefill_gemm_m64_workspace_bytes(groups));
}

void run_prefill_gemm(const PrefillGroupArrays& arrays, int groups, int tile_m, void* workspace,
                      cudaStream_t stream) {
  const char* why = nullptr;
  MK_CHECK(prefill_gemm_supported(&why), "prefill grouped GEMM cannot run: " << why);
  MK_CHECK(groups >= 1, "expected >= 1 GEMM groups, got " << groups);
  MK_CHECK(prefill_tile_m_supported(tile_m),
           "prefill grouped GEMM: expected a tile of 128 or 64 rows, got " << tile_m);
  if (tile_m == 64) {
    run_prefill_gemm_m64(arrays, groups, workspace, stream);
  } else {
    run_prefill_gemm_m128(arrays, groups, workspace, stream);
  }
}

}  // namespace moekit::cuda
