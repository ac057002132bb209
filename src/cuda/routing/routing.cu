// Launcher of the routing + dispatch kernel (routing_kernel.cuh): picks the experts-per-lane
// instantiation (4/8/16 for E <= 128/256/512) and the block size. Validation of the config
// against the kernel's limits happens in the layer (layer.cu), once, at creation.
#include "cuda/common/cuda_check.h"
#include "cuda/routing/routing.h"
#include "cuda/routing/routing_kernel.cuh"
#include "cuda/common/pdl.cuh"

namespace moekit::cuda {

void launch_routing(const RoutingParams& p, cudaStream_t stream, bool pdl) {
  if (p.tokens <= 0) return;
  using namespace routing_detail;
  const int grid = (p.tokens + kRoutingWarps - 1) / kRoutingWarps;
  // one CTA: only as many warps as tokens (at least 4, for the dispatch's loops over E + S)
  const int warps = grid > 1 ? kRoutingWarps : (p.tokens < 4 ? 4 : p.tokens);
  const int num_e = p.cfg.num_experts;
  auto* kernel = num_e <= 128   ? routing_kernel<4>
                 : num_e <= 256 ? routing_kernel<8>
                                : routing_kernel<kPerLane>;
  launch_pdl(pdl, kernel, dim3(grid), dim3(warps * 32), 0, stream, p);
}

}  // namespace moekit::cuda
