// The prefill grouped GEMM's entry (prefill_gemm.h, prefill_gemm_fp8.h): the device check and
// the dispatch by row of plan::grouped_gemm_kernels(). The instances themselves are
// instances/<name>.cu (only they see CUTLASS).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <utility>

#include "cuda/common/cuda_check.h"
#include "cuda/prefill/prefill_gemm.h"
#include "cuda/prefill/prefill_gemm_fp8.h"
#include "moekit/error.h"
#include "plan/grouped_gemm_kernels.h"

namespace moekit::cuda {

namespace {

using plan::kGroupedGemmKernels;
using plan::kNumGroupedGemmKernels;

// Every row's entries, by row (a row without its translation unit fails the link).
template <size_t... kRows>
constexpr auto row_runners(std::index_sequence<kRows...>) {
  return std::array{&run_grouped_gemm_row<static_cast<int>(kRows)>...};
}
template <size_t... kRows>
constexpr auto row_workspaces(std::index_sequence<kRows...>) {
  return std::array{&grouped_gemm_workspace_bytes_row<static_cast<int>(kRows)>...};
}
constexpr auto kRunners = row_runners(std::make_index_sequence<kNumGroupedGemmKernels>());
constexpr auto kWorkspaces = row_workspaces(std::make_index_sequence<kNumGroupedGemmKernels>());

}  // namespace

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
  size_t bytes = 0;
  for (const auto& workspace : kWorkspaces) bytes = std::max(bytes, workspace(groups));
  return bytes;
}

void run_grouped_gemm(int kernel, bool fp8, const void* arrays, int groups, void* workspace,
                      cudaStream_t stream) {
  const char* why = nullptr;
  MK_CHECK(prefill_gemm_supported(&why), "prefill grouped GEMM cannot run: " << why);
  MK_CHECK(groups >= 1, "prefill grouped GEMM: expected >= 1 groups, got " << groups);
  MK_CHECK(kernel >= 0 && kernel < kNumGroupedGemmKernels,
           "prefill grouped GEMM: expected an instance in [0, " << kNumGroupedGemmKernels
                                                                << "), got " << kernel);
  MK_CHECK(kGroupedGemmKernels[kernel].fp8 == fp8,
           "prefill grouped GEMM: " << kGroupedGemmKernels[kernel].name << " takes "
                                    << (kGroupedGemmKernels[kernel].fp8 ? "fp8" : "bf16")
                                    << " operands, the launch gives " << (fp8 ? "fp8" : "bf16"));
  kRunners[kernel](arrays, groups, workspace, stream);
}

void run_prefill_gemm(const PrefillGroupArrays& arrays, int groups, int kernel, void* workspace,
                      cudaStream_t stream) {
  run_grouped_gemm(kernel, false, &arrays, groups, workspace, stream);
}

void run_prefill_gemm_fp8(const PrefillFp8GroupArrays& arrays, int groups, int kernel,
                          void* workspace, cudaStream_t stream) {
  run_grouped_gemm(kernel, true, &arrays, groups, workspace, stream);
}

}  // namespace moekit::cuda
