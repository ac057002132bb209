// Launchers of the expert-parallel dispatch and combine kernels (dispatch_combine.cuh).
#include <algorithm>

#include "cuda/common/cuda_check.h"
#include "cuda/ep/dispatch_combine.cuh"

namespace moekit::cuda {

void launch_ep_dispatch_pack(const EpPackParams& p, cudaStream_t stream) {
  if (p.num_dests == 0) return;
  const unsigned groups =
      static_cast<unsigned>(std::max(1, (p.tokens + kPackTokens - 1) / kPackTokens));
  ep_dispatch_pack<<<dim3(groups, p.num_dests), kPackThreads, 0, stream>>>(p);
  MK_CUDA_CHECK(cudaGetLastError());
}

void launch_ep_combine(const EpCombineParams& p, cudaStream_t stream) {
  const size_t threads = static_cast<size_t>(p.tokens) * (p.hidden / kBf16PerVector);
  if (threads == 0) return;
  const unsigned blocks = static_cast<unsigned>((threads + kCombineThreads - 1) / kCombineThreads);
  ep_combine<<<blocks, kCombineThreads, 0, stream>>>(p);
  MK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moekit::cuda
