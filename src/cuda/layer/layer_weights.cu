// GpuMoeLayer::Impl's weights (layer_impl.h): allocation, upload from a LayerWeights, the device
// random fill (random_fill.cu: the host generator's formula, so a 22.6 GB DeepSeek-V3 layer
// needs no host copy), and the fused shared slots repacked on the device.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/random_values.h"
#include "cuda/common/cuda_check.h"
#include "cuda/layer/layer_impl.h"
#include "cuda/layer/random_fill.h"
#include "io/random_weight_values.h"
#include "moekit/error.h"

namespace moekit::cuda {

void GpuMoeLayer::Impl::allocate_weights() {
  const size_t rows = rows_fused();
  const size_t router_elems = static_cast<size_t>(cols) * H;
  if (spec.router_dtype == DType::F32) {
    allocate<float>(router_w, router_elems, weight_bytes);
  } else {
    allocate<__nv_bfloat16>(router_w, router_elems, weight_bytes);
  }
  if (spec.has_router_bias) allocate<float>(router_bias, E, weight_bytes);
  if (spec.has_correction_bias) allocate<float>(corr_bias, E, weight_bytes);
  if (fp8) {
    allocate<uint8_t>(w13_fp8, rows * 2 * I * H, weight_bytes);
    allocate<float>(w13_scale, rows * scales13(), weight_bytes);
    allocate<uint8_t>(w2_fp8, rows * H * I, weight_bytes);
    allocate<float>(w2_scale, rows * scales2(), weight_bytes);
  } else {
    allocate<__nv_bfloat16>(w13, rows * 2 * I * H, weight_bytes);
    allocate<__nv_bfloat16>(w2, rows * H * I, weight_bytes);
  }
  if (spec.has_expert_bias) {
    allocate<float>(b13, rows * 2 * I, weight_bytes);
    allocate<float>(b2, rows * H, weight_bytes);
    MK_CUDA_CHECK(cudaMemsetAsync(b13.ptr, 0, b13.bytes, stream));
    MK_CUDA_CHECK(cudaMemsetAsync(b2.ptr, 0, b2.bytes, stream));
  }
  if (has_shared && !fp8) {  // (fp8: the shared expert runs as its fused slots only)
    allocate<__nv_bfloat16>(shared_w13, static_cast<size_t>(2) * Is * H, weight_bytes);
    allocate<__nv_bfloat16>(shared_w2, static_cast<size_t>(H) * Is, weight_bytes);
  }
  point_at_own_weights();
}

void GpuMoeLayer::Impl::point_at_own_weights() {
  wp.router_w = router_w.ptr;
  wp.router_bias = router_bias.as<float>();
  wp.corr_bias = corr_bias.as<float>();
  wp.w13 = w13.as<__nv_bfloat16>();
  wp.w2 = w2.as<__nv_bfloat16>();
  wp.b13 = b13.as<float>();
  wp.b2 = b2.as<float>();
  wp.shared_w13 = shared_w13.as<__nv_bfloat16>();
  wp.shared_w2 = shared_w2.as<__nv_bfloat16>();
  wp.w13_fp8 = w13_fp8.as<uint8_t>();
  wp.w13_scale = w13_scale.as<float>();
  wp.w2_fp8 = w2_fp8.as<uint8_t>();
  wp.w2_scale = w2_scale.as<float>();
}

// Fused slot j = gate rows [jI,(j+1)I) and up rows Is+[jI,(j+1)I) of the shared w13, down
// columns [jI,(j+1)I) of the shared w2 (the repack of src/io/lazy_experts.h, on the device).
void GpuMoeLayer::Impl::repack_slots_on_device() {
  const size_t expert13 = static_cast<size_t>(2) * I * H, expert2 = static_cast<size_t>(H) * I;
  for (int j = 0; j < S; ++j) {
    __nv_bfloat16* dst13 = w13.as<__nv_bfloat16>() + (E + j) * expert13;
    const __nv_bfloat16* src = shared_w13.as<__nv_bfloat16>();
    MK_CUDA_CHECK(cudaMemcpyAsync(dst13, src + static_cast<size_t>(j) * I * H,
                                  static_cast<size_t>(I) * H * 2, cudaMemcpyDeviceToDevice,
                                  stream));
    MK_CUDA_CHECK(cudaMemcpyAsync(
        dst13 + static_cast<size_t>(I) * H, src + (static_cast<size_t>(Is) + j * I) * H,
        static_cast<size_t>(I) * H * 2, cudaMemcpyDeviceToDevice, stream));
    MK_CUDA_CHECK(cudaMemcpy2DAsync(
        w2.as<__nv_bfloat16>() + (E + j) * expert2, static_cast<size_t>(I) * 2,
        shared_w2.as<__nv_bfloat16>() + static_cast<size_t>(j) * I, static_cast<size_t>(Is) * 2,
        static_cast<size_t>(I) * 2, H, cudaMemcpyDeviceToDevice, stream));
  }
}

// Every copy in the layer's stream, in order with the memsets before it and the kernels after.
// why not cudaMemcpy: it runs in the legacy default stream, which a non-blocking stream does not
// wait for, and from pageable memory it may return before its DMA lands.
void GpuMoeLayer::Impl::upload(const LayerWeights& w) {
  auto to_device = [&](void* dst, const void* src, size_t bytes) {
    MK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  };
  const size_t router_elems = static_cast<size_t>(cols) * H;
  MK_CHECK(w.router_weight() != nullptr, "router weight of " << spec.name << " is missing");
  to_device(router_w.ptr, w.router_weight(), router_elems * dtype_size(spec.router_dtype));
  if (spec.has_router_bias) {
    MK_CHECK(w.router_bias() != nullptr, spec.name << " has a router bias but none was given");
    to_device(router_bias.ptr, w.router_bias(), E * sizeof(float));
  }
  if (spec.has_correction_bias) {
    MK_CHECK(w.correction_bias() != nullptr,
             spec.name << " has a correction bias but none was given");
    to_device(corr_bias.ptr, w.correction_bias(), E * sizeof(float));
  }
  const size_t expert13 = static_cast<size_t>(2) * I * H, expert2 = static_cast<size_t>(H) * I;
  for (int e = 0; e < rows_fused(); ++e) {
    const ExpertView v = w.expert(e);
    if (fp8) {
      MK_CHECK(v.w13_fp8 != nullptr && v.w13_scale != nullptr && v.w2_fp8 != nullptr &&
                   v.w2_scale != nullptr,
               "expert " << e << " of " << spec.name << " has no fp8 weights or scales");
      to_device(w13_fp8.as<uint8_t>() + e * expert13, v.w13_fp8, expert13);
      to_device(w13_scale.as<float>() + e * scales13(), v.w13_scale, scales13() * 4);
      to_device(w2_fp8.as<uint8_t>() + e * expert2, v.w2_fp8, expert2);
      to_device(w2_scale.as<float>() + e * scales2(), v.w2_scale, scales2() * 4);
    } else {
      MK_CHECK(v.w13 != nullptr && v.w2 != nullptr,
               "expert " << e << " of " << spec.name << " has no weights");
      to_device(w13.as<__nv_bfloat16>() + e * expert13, v.w13, expert13 * 2);
      to_device(w2.as<__nv_bfloat16>() + e * expert2, v.w2, expert2 * 2);
    }
    if (spec.has_expert_bias && v.b13 != nullptr) {
      to_device(b13.as<float>() + e * static_cast<size_t>(2) * I, v.b13,
                static_cast<size_t>(2) * I * sizeof(float));
    }
    if (spec.has_expert_bias && v.b2 != nullptr) {
      to_device(b2.as<float>() + e * static_cast<size_t>(H), v.b2,
                static_cast<size_t>(H) * sizeof(float));
    }
  }
  if (has_shared && !fp8) {
    MK_CHECK(w.shared_w13() != nullptr && w.shared_w2() != nullptr,
             "shared expert weights of " << spec.name << " are missing");
    to_device(shared_w13.ptr, w.shared_w13(), shared_w13.bytes);
    to_device(shared_w2.ptr, w.shared_w2(), shared_w2.bytes);
  }
}

void GpuMoeLayer::Impl::fill_random(uint64_t seed) {
  namespace rv = random_values;
  using rv::Tensor;
  const size_t router_elems = static_cast<size_t>(cols) * H;
  if (spec.router_dtype == DType::F32) {
    fill_random_f32(router_w.as<float>(), router_elems, 1, seed, layer, Tensor::RouterWeight, -1,
                    rv::weight_scale(H), stream);
  } else {
    fill_random_bf16(router_w.as<__nv_bfloat16>(), router_elems, 1, seed, layer,
                     Tensor::RouterWeight, -1, rv::weight_scale(H), stream);
  }
  if (spec.has_correction_bias) {
    fill_random_f32(corr_bias.as<float>(), E, 1, seed, layer, Tensor::CorrectionBias, -1,
                    rv::kCorrectionBiasScale, stream);
  }
  if (spec.has_router_bias) {
    fill_random_f32(router_bias.as<float>(), E, 1, seed, layer, Tensor::RouterBias, -1,
                    rv::kBiasScale, stream);
  }
  if (fp8) {
    // every row (the fused slots too) random codes, every tile weight_scale / 448
    const int rows = rows_fused();
    fill_random_e4m3(w13_fp8.as<uint8_t>(), static_cast<size_t>(2) * I * H, rows, seed, layer,
                     Tensor::ExpertW13, 0, stream);
    fill_random_e4m3(w2_fp8.as<uint8_t>(), static_cast<size_t>(H) * I, rows, seed, layer,
                     Tensor::ExpertW2, 0, stream);
    fill_f32(w13_scale.as<float>(), rows * scales13(), rv::weight_scale(H) / 448.0f, stream);
    fill_f32(w2_scale.as<float>(), rows * scales2(), rv::weight_scale(I) / 448.0f, stream);
  } else {
    fill_random_bf16(w13.as<__nv_bfloat16>(), static_cast<size_t>(2) * I * H, E, seed, layer,
                     Tensor::ExpertW13, 0, rv::weight_scale(H), stream);
    fill_random_bf16(w2.as<__nv_bfloat16>(), static_cast<size_t>(H) * I, E, seed, layer,
                     Tensor::ExpertW2, 0, rv::weight_scale(I), stream);
  }
  if (spec.has_expert_bias) {
    fill_random_f32(b13.as<float>(), static_cast<size_t>(2) * I, E, seed, layer, Tensor::ExpertB13,
                    0, rv::kBiasScale, stream);
    fill_random_f32(b2.as<float>(), H, E, seed, layer, Tensor::ExpertB2, 0, rv::kBiasScale, stream);
  }
  if (has_shared && !fp8) {
    fill_random_bf16(shared_w13.as<__nv_bfloat16>(), static_cast<size_t>(2) * Is * H, 1, seed,
                     layer, Tensor::SharedW13, -1, rv::weight_scale(H), stream);
    fill_random_bf16(shared_w2.as<__nv_bfloat16>(), static_cast<size_t>(H) * Is, 1, seed, layer,
                     Tensor::SharedW2, -1, rv::weight_scale(Is), stream);
  }
}

}  // namespace moekit::cuda
