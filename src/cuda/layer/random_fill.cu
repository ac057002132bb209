// Random weight fill on the GPU (random_fill.h). One thread per 8 values, grid.y = expert, so
// the stream key is computed once per thread and the stores are 16 bytes wide.
#include <cuda_fp8.h>

#include <algorithm>

#include "common/random_values.h"
#include "cuda/common/cuda_check.h"
#include "cuda/layer/random_fill.h"

namespace moekit::cuda {
namespace {

template <typename T>
__global__ void fill_random_kernel(T* dst, size_t count, uint64_t seed, int layer, uint32_t tensor,
                                   int first_expert, float scale) {
  const int expert = first_expert < 0 ? -1 : first_expert + static_cast<int>(blockIdx.y);
  const uint64_t stream =
      random_values::stream_key(seed, layer, static_cast<random_values::Tensor>(tensor), expert);
  T* out = dst + static_cast<size_t>(blockIdx.y) * count;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride) {
    // why __fmul_rn: one IEEE multiplication, never contracted, exactly as on the host
    const float v = __fmul_rn(random_values::uniform(stream, i), scale);
    if constexpr (sizeof(T) == 1) {
      out[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    } else if constexpr (sizeof(T) == 2) {
      out[i] = __float2bfloat16_rn(v);
    } else {
      out[i] = v;
    }
  }
}

template <typename T>
void fill(T* dst, size_t count, int experts, uint64_t seed, int layer,
          random_values::Tensor tensor, int first_expert, float scale, cudaStream_t stream) {
  if (count == 0 || experts <= 0) return;
  const int threads = 256;
  size_t blocks = (count + threads - 1) / threads;
  if (blocks > 4096) blocks = 4096;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(experts));
  fill_random_kernel<T><<<grid, threads, 0, stream>>>(dst, count, seed, layer,
                                                      static_cast<uint32_t>(tensor), first_expert,
                                                      scale);
  MK_CUDA_CHECK_LAUNCH();
}

__global__ void fill_value_kernel(float* dst, size_t count, float value) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride) {
    dst[i] = value;
  }
}

}  // namespace

void fill_random_e4m3(uint8_t* dst, size_t count, int experts, uint64_t seed, int layer,
                      random_values::Tensor tensor, int first_expert, cudaStream_t stream) {
  fill(dst, count, experts, seed, layer, tensor, first_expert, 448.0f, stream);
}

void fill_f32(float* dst, size_t count, float value, cudaStream_t stream) {
  if (count == 0) return;
  const size_t blocks = std::min<size_t>((count + 255) / 256, 4096);
  fill_value_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(dst, count, value);
  MK_CUDA_CHECK_LAUNCH();
}

void fill_random_bf16(__nv_bfloat16* dst, size_t count, int experts, uint64_t seed, int layer,
                      random_values::Tensor tensor, int first_expert, float scale,
                      cudaStream_t stream) {
  fill(dst, count, experts, seed, layer, tensor, first_expert, scale, stream);
}

void fill_random_f32(float* dst, size_t count, int experts, uint64_t seed, int layer,
                     random_values::Tensor tensor, int first_expert, float scale,
                     cudaStream_t stream) {
  fill(dst, count, experts, seed, layer, tensor, first_expert, scale, stream);
}

}  // namespace moekit::cuda
