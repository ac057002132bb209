// Launcher of the routing + dispatch kernel (routing_kernel.cuh). Validation of the config
// against the kernel's limits happens in the layer (layer.cu), once, at creation.
#include "cuda/cuda_check.h"
#include "cuda/routing/routing.h"
#include "cuda/routing/routing_kernel.cuh"
#include "cuda/layer/pdl.cuh"

namespace moekit::cuda {

void launch_routing(const RoutingParams& p, cudaStream_t stream) {
  if (p.tokens <= 0) return;
  const int grid = (p.tokens + routing_detail::kRoutingWarps - 1) / routing_detail::kRoutingWarps;
  launch_pdl(routing_detail::routing_kernel, dim3(grid), dim3(routing_detail::kRoutingThreads), 0,
             stream, p);
}

}  // namespace moekit::cuda
