// Launch code of the grouped expert kernels (experts_kernel.cuh): the variant table, the
// persistent grid size, the launch. Four instantiations in all (CI compiles on two cores).
//
// Variants (kNT n-tiles of 8 tokens, kUnroll k blocks in flight per warp):
//   T <= 8 tokens per forward: no expert can hold more than 8 tokens -> kNT = 1, kUnroll = 4
//   larger T: tasks of up to 32 tokens -> kNT = 4, kUnroll = 1 (the activation fragments of four
//             n-tiles take the registers a deeper unroll would need)
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "cuda/experts/experts.h"
#include "cuda/experts/experts_kernel.cuh"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

using experts_detail::experts_kernel;
using experts_detail::kThreads;

using KernelFn = void (*)(ExpertsParams);

KernelFn kernel_for(ExpertsKind kind, int chunk) {
  const bool gate_up = kind == ExpertsKind::GateUp;
  if (chunk == 8) return gate_up ? experts_kernel<true, 1, 4> : experts_kernel<false, 1, 4>;
  if (chunk == 32) return gate_up ? experts_kernel<true, 4, 1> : experts_kernel<false, 4, 1>;
  MK_FAIL("no expert kernel for chunk " << chunk << " (expected 8 or 32)");
}

}  // namespace

int experts_chunk(int tokens) { return tokens <= 8 ? 8 : 32; }

int experts_grid(ExpertsKind kind, int chunk) {
  int device = 0, sms = 0, per_sm = 0;
  MK_CUDA_CHECK(cudaGetDevice(&device));
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  MK_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_for(kind, chunk), kThreads, 0));
  MK_CHECK(per_sm > 0, "expert kernel (chunk " << chunk << ") cannot be resident on this device");
  return sms * per_sm;
}

void launch_experts(ExpertsKind kind, int chunk, const ExpertsParams& p, int grid,
                    cudaStream_t stream) {
  kernel_for(kind, chunk)<<<grid, kThreads, 0, stream>>>(p);
  MK_CUDA_CHECK_LAUNCH();
}

}  // namespace moekit::cuda
