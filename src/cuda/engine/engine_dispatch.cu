// engine_dispatch.h: the expansion of a caller's routing and the align step, one CTA.
#include <algorithm>

#include "cuda/common/cuda_check.h"
#include "cuda/engine/engine_dispatch.h"
#include "cuda/routing/align.cuh"

namespace moekit::cuda {
namespace {

constexpr int kEngineDispatchThreads = 1024;  // align_block's scan takes up to 32 warps

__global__ void __launch_bounds__(kEngineDispatchThreads)
    engine_dispatch_kernel(const EngineDispatchParams p) {
  const RoutingParams& rp = p.rp;
  const int k = rp.cfg.top_k, slots = k + rp.cfg.shared_slots;
  const int E = rp.cfg.num_experts;
  const int pairs = rp.tokens * slots;
  // expand: routed slots from the caller (ids checked), then the fused slots
#pragma unroll 1
  for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
    const int t = q / slots, j = q - t * slots;
    const float scale = p.shared_scale_in != nullptr ? p.shared_scale_in[t] : 1.0f;
    int id;
    float w;
    if (j < k) {
      const int g = p.topk_ids[static_cast<size_t>(t) * k + j];
      w = p.topk_weights[static_cast<size_t>(t) * k + j];
      id = g - p.expert_offset;
      if (g < 0 || g >= E) {
        atomicOr(p.status, 1);
        id = -1;  // the align step drops it
      } else if (id < 0 || id >= p.expert_count) {
        id = -1;  // another rank's
        w = 0.0f;
      }
    } else {
      id = p.expert_count + (j - k);
      w = scale;
    }
    rp.ids[q] = id;
    rp.weights[q] = w;
  }
  if (rp.shared_scale != nullptr) {
#pragma unroll 1
    for (int t = threadIdx.x; t < rp.tokens; t += blockDim.x) {
      rp.shared_scale[t] = p.shared_scale_in != nullptr ? p.shared_scale_in[t] : 1.0f;
    }
  }
  __threadfence();
  __syncthreads();
  align_detail::align_block(rp, nullptr);
}

__global__ void zero_dropped_kernel(const int32_t* ids, int pairs, float4* partial, int quads) {
  const long long n = static_cast<long long>(pairs) * quads;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    if (__ldg(ids + i / quads) == -1) partial[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

}  // namespace

void zero_dropped_partials(const int32_t* ids, int pairs, float* partial, int hidden,
                           cudaStream_t stream) {
  if (pairs <= 0) return;
  const int quads = hidden / 4;  // (hidden is a multiple of 64)
  const long long n = static_cast<long long>(pairs) * quads;
  const int grid = static_cast<int>(std::min<long long>((n + 255) / 256, 1024));
  zero_dropped_kernel<<<grid, 256, 0, stream>>>(ids, pairs, reinterpret_cast<float4*>(partial),
                                                quads);
  MK_CUDA_CHECK(cudaGetLastError());
}

void launch_engine_dispatch(const EngineDispatchParams& p, cudaStream_t stream) {
  if (p.rp.tokens <= 0) return;
  engine_dispatch_kernel<<<1, kEngineDispatchThreads, 0, stream>>>(p);
  MK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moekit::cuda
